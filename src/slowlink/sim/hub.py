"""The simulator's side of the channel: where contributions land and rounds close, in virtual time.

It plays the mailbox and its leader at once, with the method's own code: the close rule and grace window of
algorithms/rounds.py, the method's weight, combine and outer step, and the wire encodings for what each
message really weighs. A round closes at the earliest virtual time its rule holds; `close_next` closes one at
a time, so a worker woken by a commit can still take part in the rounds after it.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from ..algorithms import rounds as rounds_
from ..algorithms.method import Method, Rounds
from ..arrays import Arrays
from ..engine.channel import Arrival, Contribution
from ..frameworks.base import host_arrays
from ..wire import payload
from ..wire.commit_change import encode_change
from ..wire.fragment import encode_fragment
from .network import Network

NEVER = math.inf


@dataclass
class Landing:
    """A contribution as the store holds it: Δ decoded from what was sent, and when it landed."""

    worker: int
    fragment: int
    round: int
    delta: Arrays
    samples: int
    steps: int
    final: bool
    step_seconds: float
    landed_at: float
    nbytes: int  # what was sent: the encoded Δ


@dataclass(frozen=True)
class CommitLog:
    fragment: int
    round: int
    time: float
    contributors: tuple[tuple[int, int, int], ...]  # (worker, steps, samples), in merge order


@dataclass
class Hub:
    method: Method
    rounds: Rounds
    network: Network
    names: list[str]  # worker -> node name; a round merges in name order, as the mailbox's leader does
    params: dict[int, Arrays]  # fragment -> newest committed parameters
    versions: list[int] = field(init=False)
    states: dict[int, Arrays] = field(init=False)
    landings: dict[int, list[Landing]] = field(init=False)
    live_until: list[float] = field(init=False)
    inbox: list[list[tuple[float, int, Arrival]]] = field(init=False)  # worker -> (time, order, arrival)
    awaited: list[dict[int, int]] = field(
        init=False
    )  # worker -> fragment -> round of its newest contribution
    log: list[CommitLog] = field(default_factory=list)
    bytes_sent: list[int] = field(init=False)
    bytes_received: list[int] = field(init=False)
    residuals: dict[int, Arrays] = field(default_factory=dict)  # fragment -> the commits' encoding error
    feedback: dict[tuple[int, int], Arrays] = field(default_factory=dict)  # (worker, fragment) -> Δ's error

    def __post_init__(self) -> None:
        workers, fragments = len(self.names), len(self.params)
        self.versions = [0] * fragments
        self.states = {q: self.method.init_state(self.params[q]) for q in range(fragments)}
        self.landings = {q: [] for q in range(fragments)}
        self.live_until = [NEVER] * workers
        self.inbox = [[] for _ in range(workers)]
        self.awaited = [{} for _ in range(workers)]
        self.bytes_sent, self.bytes_received = [0] * workers, [0] * workers
        self._order = 0

    # ---- contributions in --------------------------------------------------------------------------

    def submit(self, worker: int, contribution: Contribution, now: float) -> None:
        """A worker's contribution, sent at `now`: Δ = anchor − snapshot in the snapshot's buffer (the
        channel owns it, as the mailbox channel does), through the wire encoding, landing after its upload."""
        delta = contribution.snapshot
        delta.update(host_arrays(delta))
        for name, values in delta.items():
            np.subtract(contribution.anchor[name], values, out=values)
        wire = self.method.wire()
        encoding = wire.delta_dtype or "F32"
        if wire.error_feedback:  # the node's residual, as the Courier keeps it (counted at once as merged)
            encoded, self.feedback[(worker, contribution.fragment)] = encode_fragment(
                delta, encoding, feedback=True, residual=self.feedback.get((worker, contribution.fragment))
            )
            data = payload.pack_encoded(encoded, {"kind": "delta"}, encoding=encoding)
        else:
            data = payload.pack(delta, {"kind": "delta"}, encoding=encoding)
        if encoding != "F32":
            delta, _ = payload.unpack(data)
        q, round_ = contribution.fragment, contribution.base + 1
        landed = (
            now
            if self.network.exchange == "allreduce"
            else now + self.network.upload_seconds(worker, len(data))
        )
        if self.network.exchange != "allreduce":
            self.bytes_sent[worker] += len(data)
        self.awaited[worker][q] = round_
        self.landings[q].append(Landing(worker, q, round_, delta, contribution.samples, contribution.steps,
                                        contribution.final, contribution.step_seconds, landed, len(data)))  # fmt: skip

    def leave(self, worker: int, now: float) -> None:
        self.live_until[worker] = now

    # ---- rounds closing ----------------------------------------------------------------------------

    def close_next(self, until: float) -> bool:
        """Close the earliest round whose rule holds by `until`; False if none does."""
        closing = [(time, q) for q in self.landings if (time := self._close_time(q, until)) is not None]
        if not closing:
            return False
        time, q = min(closing)
        self._commit(q, time)
        return True

    def _close_time(self, fragment: int, until: float) -> float | None:
        round_ = self.versions[fragment] + 1
        landings = sorted(
            (c for c in self.landings[fragment] if c.round == round_), key=lambda c: c.landed_at
        )
        if not landings:
            return None
        moments = sorted({c.landed_at for c in landings} | {t for t in self.live_until if t < NEVER})
        quorum_since, grace = None, NEVER
        for moment in moments:
            if quorum_since is not None and quorum_since + grace < moment:
                break
            if moment > until:
                return None
            arrived = [c for c in landings if c.landed_at <= moment]
            if not arrived:
                continue
            if quorum_since is None and rounds_.quorum_reached(self.rounds, len(arrived)):
                quorum_since = moment
                grace = rounds_.grace_seconds(self.rounds, [c.step_seconds for c in arrived])
            live = {w for w, left in enumerate(self.live_until) if left > moment}
            if rounds_.closes(every_live_node_reported=live <= {c.worker for c in arrived},
                              quorum_since=quorum_since, now=moment, grace=grace):  # fmt: skip
                return moment
        if quorum_since is None or quorum_since + grace > until:
            return None
        return quorum_since + grace

    def _commit(self, fragment: int, time: float) -> None:
        round_ = self.versions[fragment] + 1
        merged = sorted(
            (c for c in self.landings[fragment] if c.round == round_ and c.landed_at <= time),
            key=lambda c: self.names[c.worker],
        )
        anchor = self.params[fragment]
        weights = [self.method.weight(c.samples, c.steps) for c in merged]
        delta = self.method.combine((c.delta, w) for c, w in zip(merged, weights, strict=True))
        live = sum(left > time for left in self.live_until)
        shape = rounds_.round_shape(
            self.rounds,
            fragment,
            round_,
            contributors=len(merged),
            live=live,
            steps=[c.steps for c in merged],
        )
        params, self.states[fragment] = self.method.outer_step(
            delta, self.states[fragment], anchor, flush_only=all(c.final for c in merged), shape=shape
        )
        params, nbytes = self._encode_commit(fragment, params, anchor)
        self.params[fragment], self.versions[fragment] = params, round_
        self.landings[fragment] = [
            c for c in self.landings[fragment] if c.round > round_
        ]  # the late are dropped
        self.log.append(
            CommitLog(fragment, round_, time, tuple((c.worker, c.steps, c.samples) for c in merged))
        )
        if self.network.exchange == "allreduce":  # the encoded Δ is what the ring reduces, not the parameters
            nbytes = max(c.nbytes for c in merged)
        self._deliver(fragment, round_, params, {c.worker for c in merged}, time, nbytes)

    def _encode_commit(self, fragment: int, params: Arrays, anchor: Arrays) -> tuple[Arrays, int]:
        """With a lossy commit encoding, the commit is the anchor plus its encoded change, with the merger's
        error feedback, as the mailbox's merger commits it (protocol/commits.py); the bytes are what a node
        holding the anchor downloads. Snapshots are not modelled: no simulated worker joins late."""
        encoding = self.method.wire().commit_dtype
        if encoding in (None, "F32"):
            return params, len(payload.pack(params, {"kind": "params"}))
        committed, data, self.residuals[fragment] = encode_change(
            params, anchor, self.residuals.get(fragment), encoding, {}
        )
        return committed, len(data)

    def _deliver(
        self, fragment: int, round_: int, params: Arrays, merged: set[int], time: float, nbytes: int
    ) -> None:
        contributors = sorted(merged)
        for worker in range(len(self.names)):
            if self.live_until[worker] < time:
                continue
            if self.network.exchange == "allreduce":
                arrives = time + self.network.allreduce_seconds(contributors, nbytes)
                moved = (
                    2 * (len(contributors) - 1) / len(contributors) * nbytes if worker in merged else nbytes
                )
                self.bytes_sent[worker] += int(moved) if worker in merged else 0
                self.bytes_received[worker] += int(moved)
            else:
                arrives = time + self.network.download_seconds(worker, nbytes)
                self.bytes_received[worker] += nbytes
            mine = None
            if self.awaited[worker].get(fragment) == round_:
                mine = "merged" if worker in merged else "missed"
                del self.awaited[worker][fragment]
            self._order += 1
            self.inbox[worker].append((arrives, self._order, Arrival(fragment, round_, params, mine)))
            self.inbox[worker].sort(key=lambda item: item[:2])

    # ---- commits out -------------------------------------------------------------------------------

    def next_arrival(self, worker: int) -> float | None:
        return self.inbox[worker][0][0] if self.inbox[worker] else None

    def pop(self, worker: int) -> Arrival:
        return self.inbox[worker].pop(0)[2]

    def take(self, worker: int, until: float) -> list[Arrival]:
        ready = []
        while self.inbox[worker] and self.inbox[worker][0][0] <= until:
            ready.append(self.inbox[worker].pop(0)[2])
        return ready
