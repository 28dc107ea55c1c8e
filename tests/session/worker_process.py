"""One learner process for the multi-process tests: trains the demo's tiny GPT in a Session over a
DirMailbox or an S3 bucket and writes what it saw as JSON. Run as: python worker_process.py ARGS_JSON OUT_JSON."""

import hashlib
import json
import logging
import os
import sys
import time

import torch

import slowlink as sl
from slowlink.demo.corpus import TrainWindows, load_corpus
from slowlink.demo.model import build_model, make_optimizer, train_step
from slowlink.protocol.chain import newest_params

PEAK_LR = 3e-3  # a small batch and a high learning rate: a regime where averaging replicas clearly pays


def digest(model: torch.nn.Module, arrays: dict | None = None) -> str:
    """sha256 of the parameters in model order: the model's own, or `arrays` by parameter name."""
    names = [name for name, _ in model.named_parameters()]
    values = arrays or {name: p.detach().numpy() for name, p in model.named_parameters()}
    return hashlib.sha256(b"".join(values[name].astype("float32").tobytes() for name in names)).hexdigest()


def learning_rate(step: int) -> float:
    return PEAK_LR * min(1.0, (step + 1) / 20)


def main(args: dict, out_path: str) -> None:
    if os.environ.get("SLOWLINK_DEBUG_LOG"):
        logging.basicConfig(level=logging.INFO, format="%(relativeCreated)d %(threadName)s %(message)s")
    torch.set_num_threads(1)
    torch.manual_seed(args["node"])
    model = build_model("tiny", seed=0)
    optimizer = make_optimizer(model)
    windows = TrainWindows(load_corpus(), node=args["node"], seed=args.get("seed", 0))
    if "s3" in args:  # credentials come from the environment
        s3 = args["s3"]
        mailbox = sl.S3Mailbox(s3["bucket"], s3["prefix"], endpoint_url=s3["url"], region=s3["region"])
    else:
        mailbox = sl.DirMailbox(args["mailbox"])
    algorithm = sl.DiLoCo(**args["algorithm"])
    contribution_bytes = []

    def on_event(event: sl.Event) -> None:
        if event.kind == "contribution_sent":
            contribution_bytes.append(event.data["bytes"])

    with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id=f"node-{args['node']}",
                    compression=args.get("compression"), on_event=on_event, poll_seconds=0.05,
                    lease_seconds=args.get("lease_seconds", 10.0)) as session:  # fmt: skip
        joined = list(session.stats.versions)
        at_join = [newest_params(mailbox, session.run, q, v)[1] for q, v in enumerate(joined)]
        committed_at_join = hashlib.sha256(
            b"".join(at_join[q][name].tobytes() for q, group in enumerate(session.plan) for name in group)
        ).hexdigest()
        snapshot = session.adapter.snapshot([name for group in session.plan for name in group])
        joined_model = hashlib.sha256(
            b"".join(snapshot[name].tobytes() for group in session.plan for name in group)
        ).hexdigest()
        while len(mailbox.list("nodes/")) < args.get("wait_for_nodes", 0):
            time.sleep(0.05)  # a deterministic run: no round may close before every node holds a lease
        started = time.process_time()
        for step in range(args["steps"]):
            train_step(model, optimizer, windows.next_batch(args["batch"]), lr=learning_rate(step))
            session.step(samples=args["batch"])
        trained_seconds = time.process_time() - started  # CPU time: robust to a loaded machine
    stats = session.stats
    # Read back, from the store, the commits this node says it ended on (at once, before they are collected).
    committed = {}
    for fragment, version in enumerate(stats.versions):
        committed.update(newest_params(mailbox, session.run, fragment, version)[1])
    result = {
        "final_is_committed": digest(model) == digest(model, committed),
        "joined_versions": joined,
        "joined_model_is_committed": joined_model == committed_at_join,
        "final_versions": list(stats.versions),
        "final_digest": digest(model),
        "trained_seconds": trained_seconds,
        "contribution_bytes": sum(contribution_bytes),
        "stats": {key: value for key, value in stats.__dict__.items() if key != "versions"},
    }
    with open(out_path, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
