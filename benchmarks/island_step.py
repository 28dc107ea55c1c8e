"""What an island's lockstep costs each step: session.step() on a 2-rank gloo island (rank 0 broadcasts its
news every step: one tensor of four float64 values) against session.step() on a plain node.

    python benchmarks/island_step.py

Both over a MemoryMailbox (on an island only rank 0 touches the mailbox), a tiny model, no sync in the timed
steps (sync_every larger than them), so the time is the step's bookkeeping plus, on the island, the broadcast.
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

STEPS = 2000


def timed(island: bool) -> float:
    import torch
    import torch.distributed as dist

    import slowlink as sl

    model = torch.nn.Linear(4, 4)
    options = {"island": dist.group.WORLD} if island else {}
    with sl.Session(
        model, algorithm=sl.DiLoCo(sync_every=10 * STEPS), mailbox=sl.MemoryMailbox(), **options
    ) as session:
        for _ in range(100):
            session.step()
        start = time.perf_counter()
        for _ in range(STEPS):
            session.step()
        return (time.perf_counter() - start) / STEPS


def main() -> None:
    if len(sys.argv) == 3:  # one rank of the island
        import torch.distributed as dist

        rank, port = int(sys.argv[1]), sys.argv[2]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        seconds = timed(island=True)
        if rank == 0:
            print(seconds)
        dist.destroy_process_group()
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen([sys.executable, __file__, str(r), str(port)], stdout=subprocess.PIPE, env=env)
        for r in range(2)
    ]
    island = float(ranks[0].communicate()[0].decode().split()[-1])
    ranks[1].wait()
    plain = timed(island=False)
    print(f"session.step(), mean of {STEPS} steps without a sync:")
    print(f"  plain node        {plain * 1e6:8.1f} µs")
    print(
        f"  2-rank island     {island * 1e6:8.1f} µs  (rank 0; the broadcast of its news: {(island - plain) * 1e6:.1f} µs)"
    )


if __name__ == "__main__":
    main()
