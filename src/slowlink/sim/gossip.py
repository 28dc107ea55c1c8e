"""A simulated gossip run (GossipDiLoCo, NoLoCo): M workers in one process, real models and steps, the real
gossip driver (engine/gossip.py) over the simulator's peer exchange (peers.py), on virtual clocks.

The scheduler moves the worker whose clock is earliest: it trains a step, or, at a round's end, publishes Δ
and parks until its collects can be answered (every partner has published, left, or passed the deadline),
then mixes; a blocking wait moves its clock (stall). Each round's starts of all workers are handed to
`on_round(round, starts, seconds)` (default: their relative L2 consensus, recorded) once every worker has made
them; `seconds` is the virtual time the last of them was made.
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ..algorithms.gossip import GossipMethod
from ..clock import VirtualClock
from ..engine.gossip import GossipNode
from ..errors import ConfigError
from ..frameworks.base import adapter_for
from ..metrics import l2_consensus
from .network import Network
from .peers import SimBoard, SimPeers
from .run import _per_worker, seeded_models


@dataclass
class GossipWorkerReport:
    name: str
    losses: list[tuple[int, float, float]] = field(default_factory=list)  # (step, virtual time, loss)
    compute_seconds: float = 0.0
    wall_seconds: float = 0.0
    stall_seconds: dict[str, float] = field(default_factory=dict)  # "start" (Mix1) and "delta" (Mix2)
    self_mixed: Counter = field(default_factory=Counter)  # partners left out, by reason
    bytes_sent: dict[str, int] = field(default_factory=dict)  # "blocking" and "non_blocking"
    bytes_received: dict[str, int] = field(default_factory=dict)
    rounds: int = 0

    @property
    def utilization(self) -> float:
        return self.compute_seconds / self.wall_seconds if self.wall_seconds > 0 else 1.0


@dataclass
class GossipResult:
    workers: list[GossipWorkerReport]
    consensus: list[tuple[int, float]]  # (round, relative L2 distance of the round's starts from their mean)
    models: list[object]

    @property
    def wall_seconds(self) -> float:
        return max(report.wall_seconds for report in self.workers)


def run_gossip(
    method: GossipMethod,
    make_model: Callable[[], object],
    batches: Callable[[int, int], object],
    *,
    workers: int,
    steps: int,
    step_seconds: float | list[float] = 1.0,
    network: Network | None = None,
    seed: int = 0,
    loss: Callable[[object, object], object] | None = None,
    optimizer: Callable[[object], object] | None = None,
    samples: Callable[[object], int] | None = None,
    on_round: Callable[[int, list[dict], float], None] | None = None,
) -> GossipResult:
    """Simulate `workers` gossip workers training `steps` steps each (the arguments as sim.run's, but no
    jitter; step_seconds one for all or one per worker;
    `on_round(round, starts, seconds)` sees every worker's start of each round, in worker order, and when
    the last was made). Returns per worker its losses, compute, stalls by mix, partners left out, and bytes
    (blocking and non-blocking), and the consensus of each round's starts (when on_round is not given)."""
    import torch

    if not isinstance(method, GossipMethod):
        raise ConfigError(
            f"{method!r} is not a gossip method: pass e.g. sl.GossipDiLoCo(sync_every=20) (DiLoCo runs in sim.run)"
        )
    for name, value in (("workers", workers), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r} must be a positive integer")
    speeds = _per_worker("step_seconds", step_seconds, workers)
    network = network if network is not None else Network(exchange="pairwise")
    network.check_workers(workers)
    loss = loss if loss is not None else (lambda model, batch: model(*batch))
    optimizer = optimizer if optimizer is not None else (lambda params: torch.optim.AdamW(params, lr=1e-3))
    samples = samples if samples is not None else (lambda batch: len(batch[0]))
    models = seeded_models(make_model, workers, seed)
    clocks = [VirtualClock() for _ in range(workers)]
    board = SimBoard(network, workers, clocks)
    reports = [GossipWorkerReport(f"node-{i}") for i in range(workers)]
    nodes = [
        GossipNode(node_id=reports[i].name, method=method, adapter=adapter_for(models[i]),
                   exchange=SimPeers(board, i, clocks[i]), clock=clocks[i], emit=lambda event: None)
        for i in range(workers)
    ]  # fmt: skip
    consensus: list[tuple[int, float]] = []
    record = (
        on_round
        if on_round is not None
        else (lambda r, starts, _: consensus.append((r, l2_consensus(starts))))
    )
    crew = _Crew(nodes, [optimizer(m.parameters()) for m in models], models, clocks, reports, board, record)
    crew.run(batches, loss, samples, steps, speeds)
    for i, report in enumerate(reports):
        report.stall_seconds = dict(nodes[i].counters.stall_seconds)
        report.self_mixed = Counter(nodes[i].counters.self_mixed)
        report.bytes_sent, report.bytes_received = dict(board.sent[i]), dict(board.received[i])
        report.rounds = nodes[i].counters.rounds
    return GossipResult(reports, consensus, models)


@dataclass
class _Crew:
    nodes: list[GossipNode]
    optimizers: list[object]
    models: list[object]
    clocks: list[VirtualClock]
    reports: list[GossipWorkerReport]
    board: SimBoard
    record: Callable[[int, list[dict], float], None]
    starts: dict[int, dict[int, dict]] = field(default_factory=dict)  # round -> worker -> its start

    def run(self, batches, loss, samples, steps: int, step_seconds: list[float]) -> None:
        workers = len(self.nodes)
        parked, done, trained = [False] * workers, [False] * workers, [0] * workers
        for i in range(workers):
            self._started(i)
        while not all(done):
            ready = [i for i in range(workers) if not done[i] and (not parked[i] or self._decidable(i))]
            if not ready:
                raise RuntimeError("the simulated gossip run is stuck: every worker waits on another")
            i = min(ready, key=lambda w: (self.clocks[w].now(), w))
            node = self.nodes[i]
            if parked[i]:
                node.close_round_end()
                parked[i] = False
                self._started(i)
            elif trained[i] < steps:
                self._train(i, batches, loss, samples, trained[i], step_seconds[i])
                trained[i] += 1
                if node.due():
                    node.open_round_end()
                    parked[i] = True
            else:
                done[i] = True
                self.board.left.add(i)
                self.reports[i].wall_seconds = self.clocks[i].now()

    def _decidable(self, i: int) -> bool:
        node = self.nodes[i]
        return all(
            self.board.decidable(i, node.round, wait.exchange.carries, wait.group, wait.deadline)
            for wait in node.closing.waits
        )

    def _train(self, i: int, batches, loss, samples, step: int, step_seconds: float) -> None:
        batch = batches(i, step)
        self.optimizers[i].zero_grad()
        value = loss(self.models[i], batch)
        value.backward()
        self.optimizers[i].step()
        self.clocks[i].advance(step_seconds)
        self.reports[i].compute_seconds += step_seconds
        self.nodes[i].advance(samples(batch))
        self.reports[i].losses.append((step + 1, self.clocks[i].now(), float(value.detach())))

    def _started(self, i: int) -> None:
        """Worker i has its start of a round: once every worker has that round's, record it."""
        node = self.nodes[i]
        self.starts.setdefault(node.round, {})[i] = node.start
        round_starts = self.starts[node.round]
        if len(round_starts) == len(self.nodes):
            del self.starts[node.round]
            self.record(node.round, [round_starts[w] for w in range(len(self.nodes))], self.clocks[i].now())
