"""The driver of one gossip node, generic over the gossip method (algorithms/gossip.py, noloco.py) and the
peer exchange (peers.py): it counts steps, and at each round's end publishes Δ, gathers its groups' values
(waiting only where the method blocks), mixes, takes the method's outer step and starts the next round.

A partner whose values are missing, late or fail their checks is left out of the mix (the node mixes with
itself), and that is counted and reported as a `self_mixed` event with its reason. The simulator calls
`open_round_end` and `close_round_end` itself, parking the worker between them; real runs call `step`.
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..algorithms.gossip import DELTA, START, Exchange, GossipMethod, pseudo_gradient
from ..algorithms.matching import group_of, groups
from ..arrays import Arrays
from ..clock import Clock
from ..events import Event
from .peers import PeerExchange


@dataclass(frozen=True)
class Wait:
    """A collect the round's end makes: which exchange, with which group, until when."""

    exchange: Exchange
    group: tuple[int, ...]
    deadline: float


@dataclass
class Closing:
    """A round whose end is open: Δ published, the collects still to make."""

    delta: Arrays
    opened_at: float
    waits: list[Wait]


@dataclass
class GossipCounters:
    """What a gossip node has done: seconds waited per exchange (START is Mix1, DELTA Mix2), partners left
    out by reason, and each round's mean relative L2 distance to the partners whose starts came."""

    rounds: int = 0
    stall_seconds: Counter = field(default_factory=Counter)
    self_mixed: Counter = field(default_factory=Counter)
    partner_distance: list[tuple[int, float]] = field(default_factory=list)


class GossipNode:
    def __init__(
        self,
        *,
        node_id: str,
        method: GossipMethod,
        adapter: object,
        exchange: PeerExchange,
        clock: Clock,
        emit: Callable[[Event], None],
    ) -> None:
        self.node_id, self.method, self.adapter = node_id, method, adapter
        self.exchange, self.clock, self.emit = exchange, clock, emit
        self.names = method.plan(adapter.schema)[0]
        self.start = adapter.snapshot(self.names)  # x: the round's start, on the host
        self.shapes = {name: tuple(values.shape) for name, values in self.start.items()}
        self.state = method.init_state(self.start)
        self.exchanges = method.exchanges(self.names, exchange.nodes)
        self.round, self.in_round, self.step_count, self.samples = 0, 0, 0, 0
        self.counters = GossipCounters()
        self.counters.stall_seconds.update({START: 0.0, DELTA: 0.0})
        self.closing: Closing | None = None
        self._publish_starts()

    def step(self, samples: int = 1) -> None:
        """Count a step; at the round's end mix and take the outer step (waiting where the method blocks)."""
        if self.exchange.failure is not None:
            raise self.exchange.failure
        self.advance(samples)
        if self.due():
            self.open_round_end()
            self.close_round_end()

    def advance(self, samples: int) -> None:
        self.step_count, self.in_round, self.samples = (
            self.step_count + 1,
            self.in_round + 1,
            self.samples + samples,
        )

    def due(self) -> bool:
        return self.in_round >= self.method.sync_every

    def group(self, exchange: Exchange, round_: int) -> tuple[int, ...]:
        drawn = groups(self.method.seed, round_, exchange.mix, self.exchange.nodes, exchange.size)
        return group_of(self.exchange.rank, drawn)

    def _publish_starts(self) -> None:
        for exchange in self.exchanges:
            group = self.group(exchange, self.round)
            if exchange.carries == START and len(group) > 1:
                self.exchange.publish(self.round, START, group, {n: self.start[n] for n in exchange.names})

    def open_round_end(self) -> None:
        """Δ = x − θ, published to the round's DELTA groups; the collects to make, with their deadlines."""
        now = self.clock.now()
        delta = pseudo_gradient(self.start, self.adapter.snapshot(self.names))
        waits = []
        for exchange in sorted(self.exchanges, key=lambda e: not e.blocking):  # the blocking ones first
            group = self.group(exchange, self.round)
            if len(group) == 1:
                continue
            if exchange.carries == DELTA:
                self.exchange.publish(self.round, DELTA, group, {n: delta[n] for n in exchange.names})
            wait = self.method.mix_seconds if exchange.blocking else self.method.mix1_seconds
            waits.append(Wait(exchange, group, now + wait))
        self.closing = Closing(delta, now, waits)

    def close_round_end(self) -> None:
        """Collect, mix, take the outer step into the model, and start the next round."""
        closing, self.closing = self.closing, None
        mixed = {START: dict(self.start), DELTA: dict(closing.delta)}
        own = {START: self.start, DELTA: closing.delta}
        for wait in closing.waits:
            carries = wait.exchange.carries
            before = self.clock.now()
            got = self.exchange.collect(self.round, carries, wait.group, wait.deadline)
            if wait.deadline > before:  # a collect due now (Mix1 by default) reads what came: no wait
                self.counters.stall_seconds[carries] += self.clock.now() - before
            values = {self.exchange.rank: {n: own[carries][n] for n in wait.exchange.names}}
            for rank, answer in sorted(got.items()):
                reason = answer if isinstance(answer, str) else self._refusal(answer, wait.exchange.names)
                if reason is None:
                    values[rank] = answer
                else:
                    self._self_mixed(carries, rank, reason)
            mixed[carries].update(self.method.mix(wait.exchange, values))
            if carries == START:
                self._note_distance(values)
        new_start, self.state = self.method.update(self.start, mixed[START], mixed[DELTA], self.state)
        self.adapter.assign(new_start)
        self.start = {name: np.array(values, dtype=np.float32) for name, values in new_start.items()}
        self.counters.rounds += 1
        distances = self.counters.partner_distance
        distance = distances[-1][1] if distances and distances[-1][0] == self.round else None
        self.emit(Event("gossip_round", self.node_id, f"round {self.round} mixed and stepped",
                        {"round": self.round, "waited": round(self.clock.now() - closing.opened_at, 6),
                         "partner_distance": distance}))  # fmt: skip
        self.exchange.forget(self.round)
        self.round, self.in_round = self.round + 1, 0
        self._publish_starts()

    def _refusal(self, values: Arrays, names: tuple[str, ...]) -> str | None:
        """Why a partner's values cannot be mixed (another schema, not finite), or None."""
        if set(values) != set(names):
            return f"schema: tensors {sorted(set(values) ^ set(names))[:3]} differ from this run's"
        for name in names:
            array = values[name]
            if tuple(getattr(array, "shape", ())) != self.shapes[name]:
                return f"schema: {name} has shape {tuple(array.shape)}, not {self.shapes[name]}"
            if not np.isfinite(array).all():
                return f"corrupt: {name} holds NaN or infinite values"
        return None

    def _self_mixed(self, carries: str, rank: int, reason: str) -> None:
        kind = reason.split(":")[0]
        self.counters.self_mixed[kind] += 1
        mix = "Mix1" if carries == START else "Mix2"
        self.emit(Event("self_mixed", self.node_id,
                        f"round {self.round}: {mix} left out node rank {rank} ({reason}); this node mixed without it",
                        {"round": self.round, "carries": carries, "rank": rank, "reason": reason}))  # fmt: skip

    def _note_distance(self, values: dict[int, Arrays]) -> None:
        """The mean ‖x_j − x_i‖² / ‖x_i‖² over the partners whose starts came: what a node can know of
        its disagreement (the global mean is unknown to it)."""
        others = [v for rank, v in values.items() if rank != self.exchange.rank]
        if not others:
            return
        norm = sum(float(np.sum(np.square(self.start[n], dtype=np.float64))) for n in self.names) or 1.0
        spread = [
            sum(float(np.sum(np.square(v[n] - self.start[n], dtype=np.float64))) for n in self.names)
            for v in others
        ]
        self.counters.partner_distance.append((self.round, sum(spread) / len(spread) / norm))
