"""How each kind of method is run for the bench. Methods of rounds (DiLoCo and its configurations) run in
the simulator, on the real engine; gossip methods in the gossip simulator, on the real gossip driver; DeMo in
the DeMo simulator, on the real optimizer; DDP as one model on the joined batch. All are timed by one link
model (sim/network.py): a ring all-reduce for DDP's gradient, a ring all-gather for DeMo's coefficients. Each returns an Outcome; a progress
callback hears (worker-steps done, worker-steps in all).
"""

from __future__ import annotations

from collections.abc import Callable

from .. import sim
from ..algorithms.gossip import GossipMethod
from ..algorithms.method import Method
from ..frameworks.base import adapter_for
from ..wire import payload
from .config import BenchConfig
from .outcome import Outcome, merged_curve
from .task import Task

Progress = Callable[[int, int], None]


def network_of(config: BenchConfig, task: Task, exchange: str | None = None) -> sim.Network:
    return sim.Network(bandwidth=config.link_bits(task.parameters), latency=config.latency,
                       exchange=exchange or config.exchange)  # fmt: skip


def ring(workers: int) -> float:
    """What each worker sends (and receives) in a ring all-reduce, per byte reduced."""
    return 2 * (workers - 1) / workers


def simulate(
    method: Method, task: Task, config: BenchConfig, speeds: list[float], loss=None
) -> sim.SimResult:
    """The bench's sim.run: the task's model, batches and optimizer on config.workers simulated workers,
    over the config's link."""
    return sim.run(method, task.make_model, task.batch, workers=config.workers, steps=config.steps,
                   step_seconds=speeds, network=network_of(config, task), seed=config.seed,
                   loss=loss or task.loss, optimizer=task.optimizer, samples=len)  # fmt: skip


def counted_loss(task: Task, config: BenchConfig, progress: Progress):
    """The task's loss, ticking the progress display: the simulators call it once per worker-step."""
    total, done = config.workers * config.steps, [0]

    def loss(model, batch):
        done[0] += 1
        progress(done[0], total)
        return task.loss(model, batch)

    return loss


def run_rounds(name: str, method: Method, task: Task, config: BenchConfig, speeds: list[float],
               progress: Progress) -> Outcome:  # fmt: skip
    """A method of rounds in the simulator: every worker trains config.steps steps at its own speed."""
    result = simulate(method, task, config, speeds, counted_loss(task, config, progress))
    last = max(result.workers, key=lambda report: report.wall_seconds)  # it holds every newest commit
    workers = result.workers
    return Outcome(
        name=name,
        heldout_loss=task.evaluate(result.models[workers.index(last)]),
        curve=merged_curve([report.losses for report in workers]),
        bytes_sent=sum(r.bytes_sent for r in workers) / len(workers),
        bytes_received=sum(r.bytes_received for r in workers) / len(workers),
        peak_bytes_per_sync=peak_contribution(method, task, config),
        simulated_seconds=result.wall_seconds,
        utilization=sum(r.utilization for r in workers) / len(workers),
        samples=config.workers * config.steps * config.batch_size,
        syncs=len(result.commits),
    )


def peak_contribution(method: Method, task: Task, config: BenchConfig) -> int:
    """The largest fragment's Δ as the method encodes it (payload.pack, header included): what a worker sends
    in one sync to a store, or 2(M−1)/M times it through a ring."""
    adapter = adapter_for(task.make_model())
    encoding = method.wire().delta_dtype or "F32"
    sizes = [len(payload.pack(adapter.snapshot(group), {"kind": "delta"}, encoding=encoding))
             for group in method.plan(adapter.schema)]  # fmt: skip
    factor = ring(config.workers) if config.exchange == "allreduce" else 1.0
    return int(max(sizes) * factor)


def simulate_gossip(method: GossipMethod, task: Task, config: BenchConfig, loss=None) -> sim.GossipResult:
    """The bench's sim.run_gossip: as simulate, its groups' mixes timed by the pairwise link model (a pair:
    λ + 8S/W; a larger group: a ring all-reduce)."""
    return sim.run_gossip(method, task.make_model, task.batch, workers=config.workers, steps=config.steps,
                          step_seconds=config.step_time, network=network_of(config, task, "pairwise"),
                          seed=config.seed, loss=loss or task.loss, optimizer=task.optimizer, samples=len)  # fmt: skip


def run_gossip(
    name: str, method: GossipMethod, task: Task, config: BenchConfig, progress: Progress
) -> Outcome:
    """A gossip method in the gossip simulator. The workers end on different models; the held-out loss is the
    mean of theirs, and a sync is a round (its bytes, blocking and not, the same every round)."""
    result = simulate_gossip(method, task, config, counted_loss(task, config, progress))
    workers = result.workers
    sent = [sum(r.bytes_sent.values()) for r in workers]
    received = [sum(r.bytes_received.values()) for r in workers]
    rounds = max(r.rounds for r in workers)
    left_out = sum(sum(r.self_mixed.values()) for r in workers)
    notes = [f"{left_out} partners left out of their mixes (late past mix_seconds)"] if left_out else []
    return Outcome(
        name=name,
        heldout_loss=sum(task.evaluate(model) for model in result.models) / len(result.models),
        curve=merged_curve([report.losses for report in workers]),
        bytes_sent=sum(sent) / len(workers),
        bytes_received=sum(received) / len(workers),
        peak_bytes_per_sync=int(max(sent) / max(1, rounds)),
        simulated_seconds=result.wall_seconds,
        utilization=sum(r.utilization for r in workers) / len(workers),
        samples=config.workers * config.steps * config.batch_size,
        syncs=rounds,
        notes=notes,
    )


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


def simulate_demo(task: Task, config: BenchConfig, loss=None, **options):
    """The bench's sim.run_demo: sl.DeMo on config.workers nodes, the task's model, batches and schedule;
    options: more of sl.DeMo's (subtract, transform, ...), for the checks in benchmarks/."""
    return sim.run_demo(task.make_model, task.batch, workers=config.workers, steps=config.steps,
                        lr=config.demo_lr, lr_factor=task.lr_factor, step_seconds=config.step_time,
                        network=network_of(config, task, "allreduce"), seed=config.seed, loss=loss or task.loss,
                        topk=config.demo_topk, chunk=64, **{"compression_decay": config.demo_decay, **options})  # fmt: skip


def run_demo(name: str, task: Task, config: BenchConfig, progress: Progress, **options) -> Outcome:
    """DeMo (research/algorithms.md §6): each step, each node all-gathers its top-k DCT coefficients of
    momentum, packed as wire/sparse.py packs them (int16 index, bf16 value), through a ring: M−1 hops of one
    node's payload each way. Every node applies the same sign step, so node 0's model is everyone's."""
    result = simulate_demo(task, config, counted_loss(task, config, progress), **options)
    hops = config.workers - 1
    moved = hops * sum(result.bytes_per_step)  # a ring all-gather: each node passes on M−1 payloads
    return Outcome(name=name, heldout_loss=task.evaluate(result.models[0]),
                   curve=merged_curve([report.losses for report in result.workers]), bytes_sent=moved,
                   bytes_received=moved, peak_bytes_per_sync=int(hops * max(result.bytes_per_step)),
                   simulated_seconds=result.wall_seconds,
                   utilization=sum(r.utilization for r in result.workers) / config.workers,
                   samples=config.workers * config.steps * config.batch_size, syncs=config.steps)  # fmt: skip
