"""What an FSDP2 island's rank 0 holds on its host while it streams a contribution: the peak of its traced
host allocations (tracemalloc: numpy arrays and bytes) from publishing a contribution to its upload, over
what it held before, against the fragment's size whole in float32 and the payload's.

    python benchmarks/island_memory.py --tensors 32 --width 512

Two ranks of a gloo island, the model `tensors` square layers of `width` (no biases) sharded by fully_shard,
one fragment, alone in a run on a DirMailbox; 3 contributions per encoding, the largest peak of those in
which no commit was decoded (decoding a commit is the protocol's, whatever the island does).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ENCODINGS = ("F32", "BF16", "F8_E4M3")


def rank_main(rank: int, port: str, tensors: int, width: int, folder: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    import slowlink as sl
    from slowlink.collective.island import IslandLead
    from slowlink.protocol.courier import Courier

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    windows, window = [], {}
    publish, upload, deliver = IslandLead.publish, Courier._upload, Courier._deliver

    def measured(lead, contribution):
        tracemalloc.reset_peak()
        window.update(before=tracemalloc.get_traced_memory()[0], delivered=False)
        publish(lead, contribution)

    def uploaded(courier, item):
        upload(courier, item)
        peak = tracemalloc.get_traced_memory()[1] - window.pop("before")
        windows.append({"peak": peak, "payload": len(item.prepared[0]), "delivered": window["delivered"]})

    def delivered(courier, *args):
        window["delivered"] = True
        deliver(courier, *args)

    IslandLead.publish, Courier._upload, Courier._deliver = measured, uploaded, delivered
    found = {}
    for encoding in ENCODINGS:
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(tensors)])
        fully_shard(model)
        method = sl.DiLoCo(sync_every=2, overlap_steps=0, delta_dtype=encoding)
        windows.clear()
        if rank == 0:
            tracemalloc.start()
        with sl.Session(model, algorithm=method, mailbox=f"{folder}/{encoding}", node_id="island",
                        poll_seconds=0.02, island=dist.group.WORLD) as session:  # fmt: skip
            for _ in range(6):
                model(torch.randn(2, width)).pow(2).mean().backward()
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.01 * p.grad
                session.step(samples=2)
        tracemalloc.stop()
        found[encoding] = list(windows)
    if rank == 0:
        print(json.dumps(found))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=32)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.tensors, args.width, args.folder)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    load = Path("/proc/loadavg").read_text().split()[:3]
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        me = [sys.executable, __file__, "--tensors", str(args.tensors), "--width", str(args.width)]
        ranks = [subprocess.Popen([*me, "--rank", str(r), "--port", port, "--folder", folder],
                                  stdout=subprocess.PIPE, env=env) for r in range(2)]  # fmt: skip
        found = json.loads(ranks[0].communicate()[0].decode().strip().splitlines()[-1])
        ranks[1].wait()
    fragment = args.tensors * args.width * args.width * 4
    tensor = args.width * args.width * 4
    print(f"{args.tensors} tensors of {args.width}x{args.width} float32: a fragment of {fragment / 1e6:.2f} MB, "
          f"a tensor of {tensor / 1e6:.2f} MB; load average {' '.join(load)}; {time.monotonic() - start:.0f} s")  # fmt: skip
    print(
        f"{'encoding':10} {'payload MB':>11} {'rank 0 peak MB':>15} {'peak - 2 payloads MB':>21} {'windows':>8}"
    )
    for encoding, windows in found.items():
        quiet = [w for w in windows if not w["delivered"]]
        peak = max(w["peak"] for w in quiet)
        payload = max(w["payload"] for w in quiet)
        print(f"{encoding:10} {payload / 1e6:>11.2f} {peak / 1e6:>15.2f} {(peak - 2 * payload) / 1e6:>21.3f} "
              f"{len(quiet):>4} of {len(windows)}")  # fmt: skip


if __name__ == "__main__":
    main()
