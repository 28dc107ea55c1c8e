"""DeMo at `slowlink bench`'s full preset with its options from the command line, through the bench's own
code path (bench.runners.run_demo). With --topk 4096 (every coefficient of a 64×64 chunk) nothing is
compressed: --subtract 1 makes it signSGD of the averaged gradient, --subtract 0 close to signum. The check
behind docs/BENCHMARKS.md's "Checks on the DeMo and DiLoCo gaps". Usage:
PYTHONPATH=src python benchmarks/bench_demo_dense.py [--topk K] [--subtract S] [--lr LR] [--decay B]
[--batch-size N] [--seed S] [--preset P]"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import torch

from slowlink.bench import runners
from slowlink.bench.config import preset
from slowlink.bench.run import make_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topk", type=int, default=8, help="coefficients sent per chunk (the preset's 8)")
    parser.add_argument("--subtract", type=float, default=1.0, help="share of the sent part taken off m")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (the preset's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="full", help="the bench preset: full, quick or smoke")
    parser.add_argument("--transform", default="dct")
    parser.add_argument("--decay", type=float, default=None, help="momentum's β (the preset's)")
    parser.add_argument("--batch-size", type=int, default=None, help="sequences per worker (the preset's)")
    args = parser.parse_args()
    config = dataclasses.replace(preset(args.preset, seed=args.seed), demo_topk=args.topk)
    if args.batch_size is not None:
        config = dataclasses.replace(config, batch_size=args.batch_size)
    config = dataclasses.replace(config, demo_lr=args.lr or config.demo_lr,
                                 demo_decay=config.demo_decay if args.decay is None else args.decay)  # fmt: skip
    torch.set_num_threads(1)  # as the bench runs each entry
    load, began = os.getloadavg()[0], time.process_time()
    outcome = runners.run_demo("demo", make_task(config), config, lambda *_: None, subtract=args.subtract,
                               transform=args.transform)  # fmt: skip
    # bytes_sent counts a ring all-gather's M−1 hops; divided by them, one node's own payload
    hops = config.workers - 1
    print(f"{args.preset}: DeMo topk {args.topk}, batch {config.batch_size}, subtract {args.subtract}, lr {config.demo_lr}, β {config.demo_decay}, {args.transform}, "
          f"seed {args.seed}: "
          f"held-out {outcome.heldout_loss:.4f}, {outcome.bytes_sent / config.steps / hops:,.0f} B/step sent "
          f"per worker ({outcome.bytes_sent / config.steps:,.0f} with the ring's hops), "
          f"{time.process_time() - began:.0f} CPU-s, load {load:.2f} → {os.getloadavg()[0]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
