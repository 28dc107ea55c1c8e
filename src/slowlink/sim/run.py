"""A simulated run: M workers in one process, each a real model trained by real steps, driven by the real
engine (engine/node.py) over the simulator's channel, on virtual clocks. No threads, no sleeping.

The scheduler always moves the worker whose clock is earliest: it trains one step (its clock moves by its
step time) and calls the node's step, or, parked at a barrier or while leaving, takes the commit it waits
for (its clock jumps to the commit's arrival; the jump is stall). Rounds close one at a time, at the
earliest virtual time their rule holds, never later than the earliest clock, so no landing is missed.
"""

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..algorithms.gossip import GossipMethod
from ..algorithms.method import Method
from ..clock import VirtualClock
from ..engine.node import Node
from ..errors import ConfigError
from ..frameworks.base import adapter_for
from .channel import SimChannel
from .hub import CommitLog, Hub
from .network import Network


@dataclass
class WorkerReport:
    name: str
    losses: list[tuple[int, float, float]] = field(default_factory=list)  # (step, virtual time, loss)
    compute_seconds: float = 0.0
    stalled_seconds: float = 0.0
    stalls: list[tuple[float, float, str]] = field(default_factory=list)  # (from, seconds, why)
    wall_seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    events: Counter = field(default_factory=Counter)  # how many events of each kind the worker's node emitted
    steps_carried: int = 0  # steps of late contributions, carried into the next one

    @property
    def utilization(self) -> float:
        """The share of the worker's virtual time spent computing."""
        return self.compute_seconds / self.wall_seconds if self.wall_seconds > 0 else 1.0


@dataclass
class SimResult:
    workers: list[WorkerReport]
    commits: list[CommitLog]
    models: list[object]

    @property
    def wall_seconds(self) -> float:
        return max(report.wall_seconds for report in self.workers)


@dataclass
class _Worker:
    index: int
    model: object
    optimizer: object
    node: Node
    clock: VirtualClock
    channel: SimChannel
    report: WorkerReport
    step_seconds: float
    rng: np.random.Generator
    steps_done: int = 0
    trained: int | None = None  # the samples of a step trained whose session.step() is due at the clock
    parked: str | None = None  # why it waits: "barrier" or "leaving"
    parked_at: float = 0.0
    done: bool = False


def run(
    method: Method,
    make_model: Callable[[], object],
    batches: Callable[[int, int], object],
    *,
    workers: int,
    steps: int,
    step_seconds: float | list[float] = 1.0,
    jitter: float = 0.0,
    network: Network | None = None,
    seed: int = 0,
    loss: Callable[[object, object], object] | None = None,
    optimizer: Callable[[object], object] | None = None,
    samples: Callable[[object], int] | None = None,
) -> SimResult:
    """Simulate `workers` workers training `steps` steps each.

    make_model(): a fresh torch model (seeded with `seed` before each call, so every worker starts alike).
    batches(worker, step): the batch a worker trains on at its step (steps count from 0).
    step_seconds: each worker's compute time per step, one for all or one each; jitter: each step's time
    is multiplied by a factor drawn uniformly from [1 − jitter, 1 + jitter] (from the seed).
    loss(model, batch): a scalar tensor; default model(*batch), or its last element if it returns a tuple.
    optimizer(params): the inner optimizer; default AdamW(lr=1e-3). samples(batch): what a step trained on
    (default len(batch[0])). Returns per worker its losses, compute, stalls, bytes and event counts."""
    import torch

    _check_run(method, workers, steps, jitter, network)
    speeds = _per_worker("step_seconds", step_seconds, workers)
    network = network if network is not None else Network()
    network.check_workers(workers)
    loss = loss if loss is not None else _default_loss
    optimizer = optimizer if optimizer is not None else (lambda params: torch.optim.AdamW(params, lr=1e-3))
    samples = samples if samples is not None else (lambda batch: len(batch[0]))
    models = seeded_models(make_model, workers, seed)
    adapters = [adapter_for(model) for model in models]
    plan = method.plan(adapters[0].schema)
    rounds = method.rounds(len(plan))
    names = [f"node-{index}" for index in range(workers)]
    initial = {q: adapters[0].snapshot(group) for q, group in enumerate(plan)}
    hub = Hub(method, rounds, network, names, {q: dict(arrays) for q, arrays in initial.items()})
    crew = []
    for index in range(workers):
        clock = VirtualClock()
        channel = SimChannel(hub, index, clock)
        report = WorkerReport(names[index])
        node = Node(node_id=names[index], rounds=rounds, adapter=adapters[index], plan=plan, channel=channel,
                    clock=clock, latest={q: (0, initial[q]) for q in initial}, emit=_counter(report))  # fmt: skip
        crew.append(_Worker(index, models[index], optimizer(models[index].parameters()), node, clock, channel,
                            report, speeds[index], np.random.default_rng([seed, index])))  # fmt: skip
    _schedule(crew, hub, batches, loss, samples, steps, jitter)
    for worker in crew:
        worker.report.bytes_sent, worker.report.bytes_received = (
            hub.bytes_sent[worker.index],
            hub.bytes_received[worker.index],
        )
    return SimResult([worker.report for worker in crew], hub.log, models)


def seeded_models(make_model: Callable[[], object], workers: int, seed: int) -> list[object]:
    """Every worker's model, each built after seeding with `seed` (they start alike); the caller's own
    random stream goes on as if nothing ran. Every simulator (this one, gossip.py, demo.py) starts so."""
    import torch

    models, caller_rng = [], torch.random.get_rng_state()
    for _ in range(workers):
        torch.manual_seed(seed)
        models.append(make_model())
    torch.random.set_rng_state(caller_rng)
    return models


def _schedule(crew: list[_Worker], hub: Hub, batches, loss, samples, steps: int, jitter: float) -> None:
    while True:
        moments = {
            worker.index: moment for worker in crew if (moment := _next_moment(worker, hub)) is not None
        }
        earliest = min(moments.values(), default=math.inf)
        if hub.close_next(until=earliest):
            continue  # a commit may wake a parked worker before `earliest`: look again
        if not moments:
            if all(worker.done for worker in crew):
                return
            _deadlock(crew, hub)
            continue
        index = min(moments, key=lambda i: (moments[i], i))
        worker = crew[index]
        if worker.parked is not None:
            _wake(worker, moments[index])
        elif worker.trained is not None:  # the step ends now, every round closing by now closed: sync
            worker.node.begin_step(worker.trained, worker.clock.now())
            worker.trained = None
            if worker.node.waiting():
                worker.parked, worker.parked_at = "barrier", worker.clock.now()
        elif worker.steps_done < steps:
            worker.trained = _train_step(worker, batches, loss, samples, jitter)
        else:
            _start_leaving(worker, hub)


def _next_moment(worker: _Worker, hub: Hub) -> float | None:
    """When the worker next does something: its clock, or, parked, the arrival of the next commit."""
    if worker.done:
        return None
    if worker.parked is None:
        return worker.clock.now()
    arrives = hub.next_arrival(worker.index)
    return None if arrives is None else max(arrives, worker.clock.now())


def _train_step(worker: _Worker, batches, loss, samples, jitter: float) -> int:
    """Train one step on the parameters as they are now; its clock moves to the step's end. Returns the
    samples it trained on, for the session.step() at its end."""
    batch = batches(worker.index, worker.steps_done)
    worker.optimizer.zero_grad()
    value = loss(worker.model, batch)
    value.backward()
    worker.optimizer.step()
    seconds = (
        worker.step_seconds * (1 + jitter * (2 * worker.rng.random() - 1)) if jitter else worker.step_seconds
    )
    worker.clock.advance(seconds)
    worker.report.compute_seconds += seconds
    worker.steps_done += 1
    worker.report.losses.append((worker.steps_done, worker.clock.now(), float(value.detach())))
    return samples(batch)


def _wake(worker: _Worker, moment: float) -> None:
    """Take the commit a parked worker waits for; it goes on once the wait is over."""
    leaving = worker.parked == "leaving"
    worker.node.wait_for_commit(timeout=max(0.0, moment - worker.clock.now()), hold=not leaving)
    if leaving:
        worker.node.flush()
        if worker.node.state.in_flight() == 0:
            _unpark(worker)
            _leave(worker, worker.channel.hub)
    elif not worker.node.waiting():
        _unpark(worker)


def _unpark(worker: _Worker) -> None:
    seconds = worker.clock.now() - worker.parked_at
    if seconds > 0:
        worker.report.stalled_seconds += seconds
        worker.report.stalls.append((worker.parked_at, seconds, worker.parked))
    worker.parked = None


def _start_leaving(worker: _Worker, hub: Hub) -> None:
    worker.node.receive(hold=False)
    worker.node.flush()
    if worker.node.state.in_flight() == 0:
        _leave(worker, hub)
    else:
        worker.parked, worker.parked_at = "leaving", worker.clock.now()


def _leave(worker: _Worker, hub: Hub) -> None:
    worker.node.leave()
    hub.leave(worker.index, worker.clock.now())
    worker.report.wall_seconds = worker.clock.now()
    worker.done = True


def _deadlock(crew: list[_Worker], hub: Hub) -> None:
    """Every worker left is parked and no commit is coming: the leaving ones give up (as close_timeout
    would), so the rounds the others wait for can close without them; if none is leaving, it is a bug."""
    leaving = [worker for worker in crew if worker.parked == "leaving"]
    if not leaving:
        stuck = ", ".join(f"{w.report.name} ({w.parked})" for w in crew if not w.done)
        raise RuntimeError(f"the simulated run is stuck: {stuck} wait for commits no round will make")
    for worker in leaving:
        _unpark(worker)
        _leave(worker, hub)


def _counter(report: WorkerReport):
    def count(event) -> None:
        report.events[event.kind] += 1
        if event.kind == "contribution_late":
            report.steps_carried += event.data["steps"]

    return count


def _default_loss(model, batch):
    out = model(*batch)
    return out[-1] if isinstance(out, tuple) else out


def _check_run(
    method: object, workers: object, steps: object, jitter: object, network: Network | None
) -> None:
    if isinstance(method, GossipMethod):
        raise ConfigError(f"{type(method).__name__} is a gossip method: simulate it with sim.run_gossip(...)")
    if not isinstance(method, Method):
        raise ConfigError(f"{method!r} is not a slowlink method: pass e.g. sl.DiLoCo(sync_every=100)")
    for name, value in (("workers", workers), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r} must be a positive integer")
    if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter < 1:
        raise ConfigError(f"jitter={jitter!r} must be in [0, 1): a step's time varies by at most that share")
    if network is not None and network.exchange == "pairwise":
        raise ConfigError("Network(exchange='pairwise') is the exchange of gossip methods; a method of rounds "
                          "syncs through exchange='store' (the default) or 'allreduce'")  # fmt: skip


def _per_worker(option: str, value: float | list[float], workers: int) -> list[float]:
    values = list(value) if isinstance(value, list | tuple) else [value] * workers
    if len(values) != workers or not all(isinstance(v, int | float) and v > 0 for v in values):
        raise ConfigError(
            f"{option}={value!r} must be a positive number of seconds, or one per worker ({workers})"
        )
    return [float(v) for v in values]
