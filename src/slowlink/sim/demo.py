"""DeMo in the simulator: M workers in one process, each a real model with its own sl.DeMo, on virtual clocks
over the simulator's network model. Every step each worker trains, compresses (DeMo.begin_step), the payloads
are exchanged as bytes, and each worker takes its step (DeMo.end_step): the optimizer's code, no copy of it.

    result = sim.run_demo(make_model, batches, workers=4, steps=200, lr=1e-3, topk=8, values="2bit",
                      network=sim.Network(bandwidth="1Gbps", latency="5ms"))
"""

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError
from ..optim.demo import DeMo
from .network import Network
from .run import WorkerReport, _default_loss, _per_worker, seeded_models


@dataclass
class DeMoSimResult:
    workers: list[WorkerReport]  # per worker: (step, virtual time, loss), compute and stall, bytes
    models: list[object]
    optimizers: list[DeMo]
    bytes_per_step: list[float]  # the bytes a worker sent at each step, the mean over workers

    @property
    def wall_seconds(self) -> float:
        return max(report.wall_seconds for report in self.workers)


class _Driven:
    """The simulator drives DeMo's two halves itself; a worker's own step() has nothing to exchange with."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes

    def all_gather(self, payload: bytes, *, step: int, max_bytes: int) -> list[bytes | None]:
        raise RuntimeError(
            "in sim.run_demo the simulator exchanges the payloads: call begin_step and end_step"
        )


def _exchange_seconds(network: Network, sizes: list[int], worker: int) -> float:
    """From a worker's payload ready to every peer's in: an all-gather ring (exchange="allreduce"), or each
    payload one PUT and each peer's one GET from the store, the GETs in parallel (exchange="store")."""
    others = [size for peer, size in enumerate(sizes) if peer != worker]
    if not others:
        return 0.0
    if network.exchange == "allreduce":
        bits, latency = min(network.link(w) for w in range(len(sizes)))
        return len(others) * (latency + 8 * max(sizes) / bits)
    return network.upload_seconds(worker, sizes[worker]) + max(
        network.download_seconds(worker, s) for s in others
    )


def _check(workers, steps, step_seconds, network, options) -> tuple[list[float], Network]:
    for name, value in (("workers", workers), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"sim.run_demo({name}={value!r}): it must be a positive integer")
    if "exchange" in options:
        raise ConfigError("sim.run_demo(exchange=...): the simulator is the exchange; leave it out")
    network = network if network is not None else Network()
    network.check_workers(workers)
    return _per_worker("step_seconds", step_seconds, workers), network


def run_demo(
    make_model: Callable[[], object],
    batches: Callable[[int, int], object],
    *,
    workers: int = 4,
    steps: int,
    lr: float,
    step_seconds: float | list[float] = 1.0,
    network: Network | None = None,
    seed: int = 0,
    loss: Callable[[object, object], object] | None = None,
    lr_factor: Callable[[int], float] | None = None,
    **options,
) -> DeMoSimResult:
    """Simulate `workers` DeMo nodes training `steps` steps each, in lockstep (DeMo waits for every node).

    make_model(): a fresh torch model (seeded with `seed` before each call, so every worker starts alike).
    batches(worker, step): the batch a worker trains on at its step. loss(model, batch): a scalar tensor;
    default model(*batch), or its last element if it returns a tuple. lr_factor(step): the share of `lr`
    every worker steps with at a step (from 0), a schedule; default 1. options: sl.DeMo's (topk, chunk,
    values, transform, ...). A step ends for everyone when the slowest worker's payload is in everywhere."""
    speeds, network = _check(workers, steps, step_seconds, network, options)
    loss = loss if loss is not None else _default_loss
    models = seeded_models(make_model, workers, seed)
    optimizers = [DeMo(model.parameters(), lr, exchange=_Driven(workers), **options) for model in models]
    reports = [WorkerReport(f"node-{w}") for w in range(workers)]
    now, bytes_per_step = 0.0, []
    for step in range(steps):
        payloads, values = [], []
        for w, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            if lr_factor is not None:
                for group in optimizer.param_groups:
                    group["lr"] = lr * lr_factor(step)
            optimizer.zero_grad()
            value = loss(model, batches(w, step))
            value.backward()
            payloads.append(optimizer.begin_step())
            values.append(float(value.detach()))
        sizes = [len(payload) for payload in payloads]
        ready = [now + speeds[w] for w in range(workers)]
        done = max(ready[w] + _exchange_seconds(network, sizes, w) for w in range(workers))
        for w, optimizer in enumerate(optimizers):
            optimizer.end_step(payloads)
            report = reports[w]
            report.compute_seconds += speeds[w]
            report.stalled_seconds += done - ready[w]
            report.bytes_sent += sizes[w]
            report.bytes_received += sum(sizes) - sizes[w]
            report.losses.append((step + 1, done, values[w]))
        now = done
        bytes_per_step.append(sum(sizes) / workers)
    for report in reports:
        report.wall_seconds = now
    return DeMoSimResult(reports, models, optimizers, bytes_per_step)
