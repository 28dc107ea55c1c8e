"""DiLoCo at `slowlink bench`'s full preset with outer SGD at lr 1 and no momentum: the workers' models plainly
averaged every H steps. The check behind docs/BENCHMARKS.md's bench-full section, beside the `diloco` row
(outer Nesterov 0.7/0.9). Usage: PYTHONPATH=src python benchmarks/bench_plain_averaging.py [--seed S]"""

from __future__ import annotations

import argparse
import os
import time

import torch

from slowlink.algorithms.diloco import DiLoCo
from slowlink.bench.config import preset
from slowlink.bench.run import make_task
from slowlink.bench.runners import run_rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    config = preset("full", seed=parser.parse_args().seed)
    torch.set_num_threads(1)  # as the bench runs each entry
    began = time.process_time()
    method = DiLoCo(sync_every=config.sync_every, quorum_size=config.workers, overlap_steps=0,
                    flush_on_close=True, outer_lr=1.0, outer_momentum=0.0)  # fmt: skip
    pace = [config.step_time] * config.workers
    outcome = run_rounds("diloco-avg", method, make_task(config), config, pace, lambda *_: None)
    print(f"DiLoCo, outer SGD lr 1, momentum 0, seed {config.seed}: held-out {outcome.heldout_loss:.4f}, "
          f"{time.process_time() - began:.0f} CPU-s, load {os.getloadavg()[0]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
