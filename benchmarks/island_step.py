"""What an island's lockstep costs each step: session.step() on a 2-rank gloo island against a plain node,
with rank 0 answering the drivers' ask for news about every 50 ms of steps (the default) or at every step.

    python benchmarks/island_step.py

Over a MemoryMailbox (on an island only rank 0 touches the mailbox), a tiny model, each step "training" for
1 ms (a sleep), no sync in the timed steps (sync_every larger than them): what is left is the step's
bookkeeping plus, on the island, the broadcasts of rank 0's news. Medians of 3 runs.
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

STEPS, TRAIN_SECONDS = 1000, 0.001


def timed(island: bool) -> dict:
    import torch
    import torch.distributed as dist

    import slowlink as sl

    model = torch.nn.Linear(4, 4)
    options = {"island": dist.group.WORLD} if island else {}
    method = sl.DiLoCo(sync_every=10 * STEPS)
    with sl.Session(model, algorithm=method, mailbox=sl.MemoryMailbox(), **options) as session:
        for _ in range(100):
            time.sleep(TRAIN_SECONDS)
            session.step()
        messages = session.island.messages if island else 0
        spent = 0.0
        for _ in range(STEPS):
            time.sleep(TRAIN_SECONDS)
            start = time.perf_counter()
            session.step()
            spent += time.perf_counter() - start
        messages = (session.island.messages if island else 0) - messages
    return {"step_seconds": spent / STEPS, "messages": messages}


def rank_main(rank: int, port: str, every_step: bool) -> None:
    import torch.distributed as dist

    import slowlink.collective.island as island

    if every_step:
        island.CHECK_SECONDS = 0.0  # rank 0 answers at every ask: the cost of one broadcast a step
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    found = timed(island=True)
    if rank == 0:
        print(json.dumps(found))
    dist.destroy_process_group()


def on_island(every_step: bool) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, __file__, str(r), str(port), str(int(every_step))],
                              stdout=subprocess.PIPE, env=env) for r in range(2)]  # fmt: skip
    found = json.loads(ranks[0].communicate()[0].decode().split("\n")[-2])
    ranks[1].wait()
    return found


def main() -> None:
    if len(sys.argv) == 4:
        rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1")
        return
    rows = {"plain node": [], "2-rank island": [], "2-rank island, news every step": []}
    for _ in range(3):
        rows["plain node"].append(timed(island=False))
        rows["2-rank island"].append(on_island(every_step=False))
        rows["2-rank island, news every step"].append(on_island(every_step=True))
    print(
        f"session.step() over {STEPS} steps of {TRAIN_SECONDS * 1e3:.0f} ms without a sync, medians of 3 runs:"
    )
    print(f"{'':32} {'µs / step':>10} {'broadcasts':>11}")
    for name, found in rows.items():
        seconds = statistics.median(row["step_seconds"] for row in found)
        messages = statistics.median(row["messages"] for row in found)
        print(f"{name:32} {seconds * 1e6:>10.1f} {messages:>11.0f}")


if __name__ == "__main__":
    main()
