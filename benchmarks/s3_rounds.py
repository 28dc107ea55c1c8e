"""Rounds over a real S3 server: requests per round per node, and how long after a node's upload the
merged commit is visible to the other node, for a 10.3M-parameter model.

    python benchmarks/s3_rounds.py                # moto's S3 server on 127.0.0.1, about two minutes on 2 cores
    SLOWLINK_S3_ENDPOINT=... SLOWLINK_S3_BUCKET=... python benchmarks/s3_rounds.py   # any other S3 store

Two learner processes run synchronous DiLoCo rounds (a barrier each round, both nodes in it). "Training"
is a sleep and a small change of the parameters, so the cores are left to the store and the merge and the
figures measure slowlink and the store, not the model. Each process logs when it uploaded each
contribution and when it applied each commit (wall clock, one machine); the benchmark pairs them.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))
from _report import markdown_table, write_section  # noqa: E402

WIDTH, LAYERS = 800, 16  # 10.3M parameters, 41 MB in float32
STEP_SECONDS = 0.02


def worker(args: dict, out: str) -> None:
    import torch

    import slowlink as sl

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    log = []

    def on_event(event: sl.Event) -> None:
        if event.kind in ("contribution_sent", "commit_applied", "round_merged"):
            log.append(
                {
                    "kind": event.kind,
                    "at": time.time(),
                    **{k: event.data.get(k) for k in ("fragment", "round")},
                }
            )

    mailbox = sl.S3Mailbox(args["bucket"], args["prefix"], endpoint_url=args["url"], region=args["region"])
    algorithm = sl.DiLoCo(**args["algorithm"])
    with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id=f"node-{args['node']}",
                    compression=args["compression"], poll_seconds=args["poll_seconds"], on_event=on_event) as session:  # fmt: skip
        while len(mailbox.list("nodes/")) < 2:
            time.sleep(0.05)  # both nodes in every round
        first = next(model.parameters())
        for _ in range(args["steps"]):
            time.sleep(STEP_SECONDS)
            with torch.no_grad():
                first[args["node"]] += 1e-3  # a real, if tiny, change to merge
            session.step(samples=16)
        stats = session.stats
    Path(out).write_text(json.dumps({"requests": dict(session.mailbox.requests), "log": log,
                                     "rounds": stats.commits_applied, "merged": stats.rounds_merged,
                                     "bytes_sent": stats.bytes_sent, "bytes_received": stats.bytes_received}))  # fmt: skip


def run(endpoint, steps: int, algorithm: dict, compression: str | None, poll_seconds: float) -> list[dict]:
    prefix = f"slowlink-bench/{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory() as folder:
        procs = []
        for node in range(2):
            args = {"url": endpoint.url, "bucket": endpoint.bucket, "region": endpoint.region, "prefix": prefix,
                    "node": node, "steps": steps, "algorithm": algorithm, "compression": compression,
                    "poll_seconds": poll_seconds}  # fmt: skip
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--worker", json.dumps(args), f"{folder}/{node}.json"]
                )
            )
        for proc in procs:
            if proc.wait(timeout=1800) != 0:
                raise SystemExit(f"a worker failed with exit code {proc.returncode}")
        return [json.loads(Path(f"{folder}/{node}.json").read_text()) for node in range(2)]


def visibility(results: list[dict]) -> list[float]:
    """Per round: from the later of the two uploads to the commit being applied by the node that did not merge."""
    sent: dict[tuple, list[float]] = {}
    for result in results:
        for entry in result["log"]:
            if entry["kind"] == "contribution_sent":
                sent.setdefault((entry["fragment"], entry["round"]), []).append(entry["at"])
    other = next(r for r in results if r["merged"] == 0)
    seen = {(e["fragment"], e["round"]): e["at"] for e in other["log"] if e["kind"] == "commit_applied"}
    return [seen[key] - max(times) for key, times in sent.items() if key in seen and len(times) == 2]


def main() -> None:
    from tests.s3server import open_s3_endpoint

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--poll-seconds", type=float, default=0.1)
    options = parser.parse_args()
    sync_every = 10
    base = {"sync_every": sync_every, "quorum_size": 2, "overlap_steps": 0}
    configs = [
        ("F32", None, base),
        (
            "F4 + zstd, BF16 commits",
            "zstd",
            base | {"delta_dtype": "F4", "error_feedback": True, "commit_dtype": "BF16"},
        ),
    ]
    rows, request_rows = [], []
    with open_s3_endpoint() as endpoint:
        store = "moto on 127.0.0.1" if endpoint.is_moto else endpoint.url
        for name, compression, algorithm in configs:
            started = time.perf_counter()
            results = run(endpoint, options.rounds * sync_every, algorithm, compression, options.poll_seconds)
            wall = time.perf_counter() - started
            latencies = sorted(visibility(results))
            rounds = results[0]["rounds"]
            rows.append([name, rounds, f"{statistics.median(latencies):.2f}", f"{latencies[int(0.9 * (len(latencies) - 1))]:.2f}",
                         f"{max(latencies):.2f}", f"{wall:.0f}"])  # fmt: skip
            for result in results:
                role = "merger" if result["merged"] else "learner"
                requests = result["requests"]
                request_rows.append([name, role] + [f"{requests.get(verb, 0) / rounds:.1f}" for verb in ("GET", "PUT", "LIST", "DELETE")]
                                    + [f"{sum(requests.values()) / rounds:.1f}", f"{result['bytes_sent'] / rounds / 1e6:.1f}",
                                       f"{result['bytes_received'] / rounds / 1e6:.1f}"])  # fmt: skip
            print(rows[-1], flush=True)
    body = f"""Store: {store}. Model: an MLP of {LAYERS}×{WIDTH}² weights, 10.3M parameters (41 MB in float32), one fragment;
two learner processes, standard DiLoCo (H={sync_every}, a barrier each round, both nodes in every round), poll every
{options.poll_seconds} s, a "step" is a {STEP_SECONDS * 1000:.0f} ms sleep. Upload → visible is, per round, the time from the later of the two
nodes' uploads (both PUTs done) to the other node applying the commit: the merger's download of both contributions,
the merge and outer step, its upload of the parameters (and momentum, and change), then the other node's poll and
download. It includes up to one poll interval and one step.

{markdown_table(["wire", "rounds", "upload → visible, median s", "p90 s", "max s", "run wall s"], rows)}

Requests and bytes per round, per node (joining and leaving included, spread over the rounds). The merger
uploads its own contribution, the parameters and the outer momentum each round (plus the change with
commit_dtype); the learner's GETs are mostly its head.json polls while it waits at the barrier, one per
poll interval, conditional (an unchanged head.json answers without a body), so their number follows
poll_seconds and the round's latency, not the model's size.

{markdown_table(["wire", "node", "GET", "PUT", "LIST", "DELETE", "all", "MB sent", "MB received"], request_rows)}
"""
    write_section("s3-rounds", "Rounds over S3: requests per round and upload-to-visible time", body)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]), sys.argv[3])
    else:
        main()
