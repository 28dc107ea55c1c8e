"""The real side of tests/bench/test_bench_is_the_real_code.py: one process of a bench entry, as a user runs
it. python nodes.py ENTRY RANK MAILBOX OUT  (a DiLoCo entry's method in a Session over a DirMailbox)
python nodes.py demo RANK PORT OUT           (sl.DeMo over a gloo process group on 127.0.0.1)
Each trains the smoke preset's micro GPT on the bench's batches and writes the final parameters."""

import sys
import time

import torch
import torch.distributed as dist
from safetensors.torch import save_file

import slowlink as sl
from slowlink.bench.config import PRESETS
from slowlink.bench.registry import METHODS
from slowlink.bench.task import Task

CONFIG = PRESETS["smoke"]


def task() -> Task:
    return Task(CONFIG.model, seed=CONFIG.seed, batch_size=CONFIG.batch_size, steps=CONFIG.steps,
                eval_windows=CONFIG.eval_windows)  # fmt: skip


def parameters(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone().contiguous() for name, p in model.named_parameters()}


def session_node(entry: str, rank: int, mailbox: str) -> dict[str, torch.Tensor]:
    """The loop a user writes: a step of the bench's AdamW recipe, then session.step()."""
    bench, store = task(), sl.DirMailbox(mailbox)
    model = bench.make_model()
    optimizer = bench.optimizer(model.parameters())
    method = METHODS[entry].method(CONFIG)
    with sl.Session(
        model, algorithm=method, mailbox=store, node_id=f"node-{rank}", poll_seconds=0.01
    ) as session:
        while len(store.list("nodes/")) < CONFIG.workers:
            time.sleep(0.02)  # a deterministic run: no round may close before every node holds a lease
        for step in range(CONFIG.steps):
            batch = bench.batch(rank, step)
            optimizer.zero_grad()
            bench.loss(model, batch).backward()
            optimizer.step()
            session.step(samples=len(batch))
    return parameters(model)


def demo_node(rank: int, port: str) -> dict[str, torch.Tensor]:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=CONFIG.workers
    )
    try:
        bench = task()
        model = bench.make_model()
        # exchange=None: DeMo finds the process group and all-gathers through torch.distributed
        optimizer = sl.DeMo(
            model.parameters(),
            CONFIG.demo_lr,
            topk=CONFIG.demo_topk,
            chunk=64,
            seed=CONFIG.seed,
            compression_decay=CONFIG.demo_decay,
        )
        for step in range(CONFIG.steps):  # the loop a user writes, on the bench's schedule
            for group in optimizer.param_groups:
                group["lr"] = CONFIG.demo_lr * bench.lr_factor(step)
            optimizer.zero_grad()
            bench.loss(model, bench.batch(rank, step)).backward()
            optimizer.step()
    finally:
        dist.destroy_process_group()
    return parameters(model)


if __name__ == "__main__":
    torch.set_num_threads(1)  # the bench's own setting
    kind, rank, where, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    save_file(demo_node(rank, where) if kind == "demo" else session_node(kind, rank, where), out)
