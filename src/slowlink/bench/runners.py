"""How each kind of method is run for the bench. Methods of rounds (DiLoCo and its configurations) run in
the simulator, on the real engine; DDP and DeMo exchange every step, so they run in lockstep here, timed by
the same link model (sim/network.py): a ring all-reduce for DDP's gradient, a ring all-gather for DeMo's
coefficients. Each returns an Outcome; a progress callback hears (worker-steps done, worker-steps in all).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import sim
from ..algorithms.method import Method
from ..frameworks.base import adapter_for
from ..optim.demo import DeMo
from ..wire import payload
from .config import BenchConfig
from .lockstep import LockstepGroup, run_in_lockstep
from .outcome import Outcome, merged_curve
from .task import Task

Progress = Callable[[int, int], None]


def network_of(config: BenchConfig, task: Task, exchange: str | None = None) -> sim.Network:
    return sim.Network(bandwidth=config.link_bits(task.parameters), latency=config.latency,
                       exchange=exchange or config.exchange)  # fmt: skip


def ring(workers: int) -> float:
    """What each worker sends (and receives) in a ring all-reduce, per byte reduced."""
    return 2 * (workers - 1) / workers


def simulate(method: Method, task: Task, config: BenchConfig, speeds: list[float], loss=None,
             exchange: str | None = None) -> sim.SimResult:  # fmt: skip
    """The bench's sim.run: the task's model, batches and optimizer on config.workers simulated workers,
    over the config's link (through `exchange` if given, e.g. "pairwise" for a gossip method)."""
    return sim.run(method, task.make_model, task.batch, workers=config.workers, steps=config.steps,
                   step_seconds=speeds, network=network_of(config, task, exchange), seed=config.seed,
                   loss=loss or task.loss, optimizer=task.optimizer, samples=len)  # fmt: skip


def run_rounds(name: str, method: Method, task: Task, config: BenchConfig, speeds: list[float],
               progress: Progress, exchange: str | None = None) -> Outcome:  # fmt: skip
    """A method of rounds in the simulator: every worker trains config.steps steps at its own speed."""
    total, done = config.workers * config.steps, [0]

    def loss(model, batch):  # sim.run calls it once per worker-step: the progress display's tick
        done[0] += 1
        progress(done[0], total)
        return task.loss(model, batch)

    result = simulate(method, task, config, speeds, loss, exchange)
    last = max(result.workers, key=lambda report: report.wall_seconds)  # it holds every newest commit
    workers = result.workers
    return Outcome(
        name=name,
        heldout_loss=task.evaluate(result.models[workers.index(last)]),
        curve=merged_curve([report.losses for report in workers]),
        bytes_sent=sum(r.bytes_sent for r in workers) / len(workers),
        bytes_received=sum(r.bytes_received for r in workers) / len(workers),
        peak_bytes_per_sync=peak_contribution(method, task, config, exchange),
        simulated_seconds=result.wall_seconds,
        utilization=sum(r.utilization for r in workers) / len(workers),
        samples=config.workers * config.steps * config.batch_size,
        syncs=len(result.commits),
    )


def peak_contribution(method: Method, task: Task, config: BenchConfig, exchange: str | None = None) -> int:
    """The largest fragment's Δ as the method encodes it (payload.pack, header included): what a worker sends
    in one sync to a store, or 2(M−1)/M times it through a ring."""
    adapter = adapter_for(task.make_model())
    encoding = method.wire().delta_dtype or "F32"
    sizes = [len(payload.pack(adapter.snapshot(group), {"kind": "delta"}, encoding=encoding))
             for group in method.plan(adapter.schema)]  # fmt: skip
    factor = ring(config.workers) if (exchange or config.exchange) == "allreduce" else 1.0
    return int(max(sizes) * factor)


def run_ddp(name: str, task: Task, config: BenchConfig, progress: Progress) -> Outcome:
    """Data parallel: every step, the workers' fp32 gradients are averaged by a ring all-reduce, not
    overlapped with the backward pass, and one AdamW step is taken. The workers then hold one model, so it is
    trained once on the joined batch: the mean of the workers' mean losses is the joined batch's mean loss."""
    model = task.make_model()
    optimizer = task.optimizer(model.parameters())
    gradient = 4 * task.parameters  # fp32
    network = network_of(config, task, exchange="allreduce")
    step_seconds = config.step_time + network.allreduce_seconds(list(range(config.workers)), gradient)
    curve = []
    for step in range(config.steps):
        optimizer.zero_grad()
        value = task.loss(model, task.global_batch(config.workers, step))
        value.backward()
        optimizer.step()
        curve.append((step + 1, (step + 1) * step_seconds, float(value.detach())))
        progress((step + 1) * config.workers, config.steps * config.workers)
    moved = ring(config.workers) * gradient
    return Outcome(name=name, heldout_loss=task.evaluate(model), curve=curve,
                   bytes_sent=moved * config.steps, bytes_received=moved * config.steps,
                   peak_bytes_per_sync=int(moved), simulated_seconds=config.steps * step_seconds,
                   utilization=config.step_time / step_seconds,
                   samples=config.workers * config.steps * config.batch_size, syncs=config.steps)  # fmt: skip


def train_demo_node(task: Task, config: BenchConfig, optimizer: DeMo, model, rank: int,
                    progress: Callable[[], None]) -> list[float]:  # fmt: skip
    """One DeMo node's loop: the step's learning rate, its own batch, a step (whose all-gather waits for the
    others). Returns its losses."""
    losses = []
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = config.demo_lr * task.lr_factor(step)
        optimizer.zero_grad()
        value = task.loss(model, task.batch(rank, step))
        value.backward()
        optimizer.step()
        losses.append(float(value.detach()))
        progress()
    return losses


def demo_nodes(task: Task, config: BenchConfig, progress: Callable[[], None]):
    """DeMo on config.workers nodes in this process, in lockstep: (models, optimizers, losses per node)."""
    group = LockstepGroup(config.workers)
    models = [task.make_model() for _ in range(config.workers)]
    optimizers = [DeMo(model.parameters(), config.demo_lr, topk=config.demo_topk, chunk=64, seed=config.seed,
                       exchange=group.member(rank)) for rank, model in enumerate(models)]  # fmt: skip
    nodes = [lambda r=r: train_demo_node(task, config, optimizers[r], models[r], r, progress)
             for r in range(config.workers)]  # fmt: skip
    losses = run_in_lockstep(group, nodes)
    return models, optimizers, losses


def run_demo(name: str, task: Task, config: BenchConfig, progress: Progress) -> Outcome:
    """DeMo (research/algorithms.md §6): each step, each node all-gathers its top-k DCT coefficients of
    momentum, packed as wire/sparse.py packs them (int16 index, bf16 value), through a ring: M−1 hops of one
    node's payload each way. Every node applies the same sign step, so node 0's model is everyone's."""
    total, done = config.workers * config.steps, [0]

    def tick() -> None:
        done[0] += 1
        progress(done[0], total)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core per node thread; a sign step turns any rounding difference into ±lr
    try:
        models, optimizers, losses = demo_nodes(task, config, tick)
    finally:
        torch.set_num_threads(threads)
    per_step = optimizers[0].stats["sent_bytes"] / config.steps  # one node's payload, each step
    bits, latency = network_of(config, task).link(0)
    hops = config.workers - 1
    step_seconds = config.step_time + hops * (latency + 8 * per_step / bits)
    curve = [(step + 1, (step + 1) * step_seconds, sum(rows) / len(rows))
             for step, rows in enumerate(zip(*losses, strict=True))]  # fmt: skip
    moved = hops * per_step * config.steps
    return Outcome(name=name, heldout_loss=task.evaluate(models[0]), curve=curve, bytes_sent=moved,
                   bytes_received=moved, peak_bytes_per_sync=int(hops * per_step),
                   simulated_seconds=config.steps * step_seconds, utilization=config.step_time / step_seconds,
                   samples=config.workers * config.steps * config.batch_size, syncs=config.steps)  # fmt: skip
