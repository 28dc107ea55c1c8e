"""One node for the Trainer tests: trains a tiny Hugging Face model with transformers.Trainer and
SlowlinkCallback over a DirMailbox, then writes what it saw as JSON.
Run as: python trainer_node.py ARGS_JSON OUT_JSON."""

import json
import sys
import time

import torch
from tiny_hf import build_model, dataset, digest, losses, training_args
from transformers import Trainer, TrainerCallback

import slowlink as sl
from slowlink.integrations.transformers import SlowlinkCallback


class WaitForNodes(TrainerCallback):
    """Holds training until every node has joined, so that no round closes before all nodes hold a lease:
    the run is then the same whatever the machine's load."""

    def __init__(self, mailbox: sl.DirMailbox, nodes: int) -> None:
        self.mailbox, self.nodes = mailbox, nodes

    def on_train_begin(self, args, state, control, **kwargs):
        while len(self.mailbox.list("nodes/")) < self.nodes:
            time.sleep(0.05)


def main(args: dict, out_path: str) -> None:
    torch.set_num_threads(1)
    model = build_model(args["arch"])  # every node builds the same architecture from the same seed
    mailbox = sl.DirMailbox(args["mailbox"])
    algorithm = sl.DiLoCo(sync_every=args["sync_every"], quorum_size=args["nodes"], overlap_steps=0,
                          outer_lr=1.0, outer_momentum=0.0)  # fmt: skip
    session = sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id=f"node-{args['node']}",
                         poll_seconds=0.05, lease_seconds=10.0)  # fmt: skip
    trainer = Trainer(model=model, args=training_args(args["output_dir"], args["steps"], data_seed=args["node"]),
                      train_dataset=dataset(args["node"]), callbacks=[SlowlinkCallback(session), WaitForNodes(mailbox, args["nodes"])])  # fmt: skip
    trainer.train()
    stats = session.stats
    result = {"losses": losses(trainer), "digest": digest(model), "versions": list(stats.versions),
              "step": stats.step, "samples": stats.samples, "commits_applied": stats.commits_applied,
              "rejected": stats.contributions_rejected, "open": session.is_open}  # fmt: skip
    with open(out_path, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
