"""Closing a round: the elected node lists a fragment's next round, judges each contribution, merges the
accepted ones, applies the outer optimizer and commits. The commit is create-once, so two leaders racing
can never commit a round twice: the loser adopts the winner's record.

A round closes when every live node has contributed, or when `quorum_size` contributions are in and the
grace window since the quorum has passed; one whose every contribution is rejected commits empty once every
live node has reported. Contributions are streamed into the merge one at a time. What a commit leaves to
tidy is done every few seconds (housekeeping.py).
"""

import ctypes
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..algorithms import rounds as rounds_
from ..algorithms.method import Method
from ..algorithms.robust import l2_norm
from ..arrays import Arrays
from ..errors import PayloadError
from ..events import Event
from ..mailbox.contract import Mailbox
from ..wire import payload
from . import contribution, keys
from .chain import newest_snapshot
from .commits import CommitWriter
from .housekeeping import Housekeeping
from .judge import Judge, check_record, contributors_of
from .leases import Leases
from .looks import Looks
from .own import OwnContributions
from .run import HEAD_EVERY, Run, Written, advance_head, get_blob, read_commit

HELD = 4  # contributions of a round kept as read for the merge; the others are read again when it closes


@dataclass
class OpenRound:
    round: int
    accepted: dict[str, dict] = field(default_factory=dict)  # node -> contribution record
    rejected: dict[str, str] = field(default_factory=dict)  # node -> reason
    quorum_at: float | None = None
    norms: dict[str, float] = field(default_factory=dict)  # node -> ‖Δ‖ measured from its payload
    steps: dict[str, int] = field(default_factory=dict)  # node -> the steps its Δ is taken to span (bounded)
    held: dict[str, bytes] = field(default_factory=dict)  # node -> its object as read, up to HELD of them


@dataclass(frozen=True)
class Committed:
    fragment: int
    round: int
    params: Arrays
    record: dict


class Merger:
    def __init__(
        self,
        mailbox: Mailbox,
        run: Run,
        method: Method,
        node_id: str,
        emit: Callable[[Event], None],
        clock: Callable[[], float] = time.monotonic,
        leases: Leases | None = None,
        compression: str | None = None,
    ) -> None:
        self.mailbox, self.run, self.method, self.node_id = mailbox, run, method, node_id
        self.emit, self.clock = emit, clock
        # Membership at a run's start (_ready): the leases this node reads, leader or not, and until when a
        # view short of the quorum may still miss a node that has not written its lease, or is not read yet.
        self.leases = leases
        self.membership_known_at = clock() + leases.lease_seconds if leases is not None else -math.inf
        self.rounds, self.wire = method.rounds(len(run.plan)), method.wire()
        self.outer_states: dict[int, tuple[int, Arrays]] = {}  # fragment -> (version, the method's state)
        self.open: dict[int, OpenRound] = {}
        self.head: list[int] = [0] * len(run.plan)
        self.judge = Judge(self.rounds)
        self.writer = CommitWriter(mailbox, run, self.wire, node_id, emit, compression)
        self.head_written: Written | None = None  # head.json as this node last wrote it
        self.housekeeping = Housekeeping(mailbox, len(run.plan), node_id, emit, clock)
        self.own = OwnContributions(mailbox, node_id)  # this node's contributions, kept in memory
        self.looks = Looks(self.rounds)  # when rounds/ is listed; the courier paces its turns by next_look_at
        self.next_look_at = float("inf")

    def step(
        self,
        versions: dict[int, tuple[int, Arrays]],
        live_nodes: Callable[[bool], set[str]],
        head: list[int],
    ) -> list[Committed]:
        """Look once at the next round of every fragment (one LIST for all); commit those that are ready.

        versions: fragment -> (its newest commit, that commit's parameters) for the fragments to merge.
        live_nodes(fresh): the nodes whose leases are live; fresh=True reads the leases again first.
        head: the newest commit of every fragment this node has read and checked.
        """
        self.head = head
        self.own.forget(head)  # rounds committed by another merger too
        nodes_by_round: dict[tuple[int, int], list[str]] = {}
        for fragment, round_ in self.own.kept:  # this node's own contributions need no listing
            nodes_by_round.setdefault((fragment, round_), []).append(self.node_id)
        due, self.next_look_at = self.looks.due(self.clock(), self.open, versions)
        if due:
            self.looks.looked(self.clock())
            others = live_nodes(False) - {self.node_id}
            found = self.looks.probes(
                self.clock(), self.open, versions, set(self.own.kept), others, self.node_id
            )
            if found is None:  # rounds/ listed: what it shows, and the merged rounds' garbage
                listing = self.mailbox.list(keys.ROUNDS)
                self.housekeeping.merged_rounds(listing, head)
                found = [parsed for item in listing if (parsed := keys.parse_contribution(item.key))]
            for fragment, round_, node in found:
                if node not in nodes_by_round.get((fragment, round_), []):
                    nodes_by_round.setdefault((fragment, round_), []).append(node)
        committed = []
        for fragment, (version, anchor) in sorted(versions.items()):
            current = self.open.get(fragment)
            if current is None or current.round != version + 1:
                current = self.open[fragment] = OpenRound(version + 1)
            self._read_new_contributions(fragment, current, nodes_by_round.get((fragment, current.round), []))
            if (
                self._ready(current, live_nodes)
                and (done := self._commit(fragment, current, anchor, live_nodes(False))) is not None
            ):
                committed.append(done)
        if due:  # what the look read may start a round's grace window
            self.next_look_at = self.looks.next_look(self.clock(), self.open, versions)
        return committed

    def move_head(self, known: list[int], every: int | None = None) -> None:
        """Name the newest commits in head.json once one fragment is `every` (HEAD_EVERY) commits past what
        it names (every=1: now, as when leaving): a hint, so one PUT every few commits, not one per commit."""
        every = HEAD_EVERY if every is None else every
        named = self.head_written[0] if self.head_written is not None else [0] * len(known)
        fragment = max(range(len(known)), key=lambda q: known[q] - named[q])
        if known[fragment] - named[fragment] >= every:
            self.head_written = advance_head(
                self.mailbox, known, fragment, known[fragment], self.head_written
            )

    def leave(self, head: list[int]) -> None:
        """Before this merger leaves: name its newest commits in head.json, and note what that frees (its
        last housekeeping.tidy(head) deletes it)."""
        self.move_head(head, every=1)
        if self.head_written is not None:
            for fragment, newest in enumerate(head):
                self.housekeeping.collect(fragment, newest, self.head_written[0][fragment])

    def remember_own(self, record: dict, data: bytes) -> None:
        """This node's contribution, kept here rather than written: the merge reads it from here (own.py)."""
        self.own.keep(record, data)
        self.looks.own_sent()  # others' contributions to that round may be in: look soon

    def _read_new_contributions(self, fragment: int, current: OpenRound, nodes: list[str]) -> None:
        for node in nodes:
            if node in current.accepted or node in current.rejected:
                continue
            try:
                own = self.own.get(fragment, current.round) if node == self.node_id else None
                if own is not None:
                    record = own[0]
                else:  # with a run key, an unsigned or forged contribution fails here
                    key, limit = (
                        keys.contribution(fragment, current.round, node),
                        self.run.max_payload_bytes(fragment),
                    )
                    found = self.mailbox.get(key, max_bytes=limit)
                    if found is None or found.data is None:
                        continue
                    record = contribution.read(found.data, self.run, fragment, current.round, node)
                    if len(current.held) < HELD:
                        current.held[node] = found.data
                check_record(record, node, fragment, current.round)
            except PayloadError as error:
                self._reject(current, node, str(error))
                continue
            current.accepted[node] = record
        if current.quorum_at is None and rounds_.quorum_reached(self.rounds, len(current.accepted)):
            current.quorum_at = self.clock()

    def _reject(self, current: OpenRound, node: str, reason: str) -> None:
        current.rejected[node] = reason
        current.accepted.pop(node, None)
        self.emit(Event("contribution_rejected", self.node_id, f"round {current.round} from {node}: {reason}",
                        {"round": current.round, "from": node, "reason": reason}))  # fmt: skip

    def _ready(self, current: OpenRound, live_nodes: Callable[[bool], set[str]]) -> bool:
        """Closing before the quorum and grace say so needs every live node to have reported, on a view of
        the leases at most a couple of seconds old (live_nodes(True)): a node that joined is waited for, one
        that left is not waited for long. A view naming a node yet to report is read again (to learn whether
        it left) only when that can shorten the wait: short of the quorum, or half a grace window after it."""
        reported = set(current.accepted) | set(current.rejected)
        # Nothing reported, nothing to close: no lease read (each one costs a LIST, and one read after joining
        # is what session.batch_size waits for, to count the nodes started with this one).
        if not reported:
            return False
        accepted_steps = [record["step_seconds"] for record in current.accepted.values()]
        grace = rounds_.grace_seconds(self.rounds, accepted_steps) if accepted_steps else 0.0
        live = live_nodes(False)
        if live <= reported or current.quorum_at is None or self.clock() - current.quorum_at >= grace / 2:
            live = live_nodes(True)
        every_live_node_reported = live <= reported
        if not current.accepted:
            # Every contribution so far was rejected: once every live node has reported, the round commits
            # empty, and each rejected node learns from that commit why, and carries its steps on.
            return every_live_node_reported
        if current.quorum_at is None:
            # Short of the quorum, only every live node's report closes it, and only on a view that can be
            # trusted to hold every node: one that has seen the quorum live (a node has left since), or one
            # a lease old. At a run's start the others may not have written their leases yet.
            seen = max(len(live), self.leases.most_live if self.leases is not None else 0)
            known = seen >= self.rounds.quorum_size or self.clock() >= self.membership_known_at
            return every_live_node_reported and known
        return rounds_.closes(every_live_node_reported=every_live_node_reported,
                              quorum_since=current.quorum_at, now=self.clock(), grace=grace)  # fmt: skip

    def _contributions(
        self, fragment: int, current: OpenRound, anchor_norm: float, weights: dict[str, float]
    ):
        """Yield (Δ, weight) of each accepted contribution whose payload passes every check, one at a time:
        each Δ is a view of its payload's bytes, dropped before the next is read.

        A Δ's norm is measured from its payload and judged against the norms the other contributors report
        and those of the fragment's recent contributions (`norm_outliers`), and against the anchor's own
        norm: a node can misreport only its own norm, and that moves the others' median by one rank."""
        reported = {node: record["norm"] for node, record in current.accepted.items()}
        history = self.judge.history(fragment)
        for node, record in sorted(current.accepted.items()):
            try:
                delta = self._load_contribution(fragment, current, node, record["blob"])
                current.norms[node] = norm = l2_norm(self.run.judged(delta))
                self.judge.judge_norm(node, norm, reported, history, anchor_norm, current.steps[node])
            except PayloadError as error:
                self._reject(current, node, str(error))
                continue
            yield delta, weights[node]
            del delta

    def _load_contribution(self, fragment: int, current: OpenRound, node: str, sha: str) -> Arrays:
        limit, round_ = self.run.max_payload_bytes(fragment), current.round
        own = self.own.get(fragment, round_) if node == self.node_id else None
        if own is not None and own[0]["blob"] == sha:
            data = own[1]
        elif (data := current.held.pop(node, None)) is None:  # read again: a later life may have replaced it
            found = self.mailbox.get(keys.contribution(fragment, round_, node), max_bytes=limit)
            if found is None or found.data is None:
                raise PayloadError("its payload is missing from the mailbox")
            data = found.data
        self.housekeeping.payload_bytes[(fragment, round_, node)] = len(data)
        delta, _ = payload.unpack(
            data,
            expected_digest=sha,
            expect=self.run.expect(kind="delta", fragment=fragment, round=round_, node=node),
            max_bytes=limit,
            expect_shapes=self.run.shapes(fragment),
        )
        if set(delta) != set(self.run.plan[fragment]):
            raise PayloadError(f"delta holds tensors {sorted(delta)}, not fragment {fragment}'s")
        return delta

    def _weights(self, current: OpenRound) -> dict[str, float]:
        """Each contribution's merge weight from its claims bounded (bounded_claims); the bounded steps
        are kept in `current.steps` for judging its norm."""
        claims = {node: (record["samples"], record["steps"]) for node, record in current.accepted.items()}
        bounded = self.judge.bounded(claims)
        current.steps = {node: steps for node, (_, steps) in bounded.items()}
        return {node: self.method.weight(*bounded[node]) for node in claims}

    def _outer_state(self, fragment: int, version: int, anchor: Arrays) -> Arrays:
        """The method's state after commit `version`: held from this node's own last commit, else read from
        the store, as the newest commit names it (or, from older code, as the newest snapshot holds it). A
        new merger thus carries on from a state at most OUTER_EVERY rounds (or a snapshot interval) old: the
        rounds since moved the parameters (which it rebuilds exactly), not the state."""
        held = self.outer_states.get(fragment)
        if held is not None and held[0] == version:
            return held[1]
        self.writer.last_outer.pop(fragment, None)  # another merger's commits came between: write anew
        if version == 0:  # the chain starts at the run's initial model, which run.json's blobs hold
            self.writer.last_snapshot.setdefault(fragment, 0)
            return self.method.init_state(anchor)
        newest = read_commit(self.mailbox, fragment, version)
        if newest is not None and not self.judge.knows(fragment):  # a new merger learns them from the store
            self.judge.remember(fragment, newest["contributors"])
        snapshot_round, record = newest_snapshot(self.mailbox, fragment, version)
        self.writer.last_snapshot[fragment] = snapshot_round
        if newest is not None and newest["outer_state"] is not None:
            record = newest
        if record is None or record["outer_state"] is None:
            return self.method.init_state(anchor)
        outer_round = record.get("outer_round", record["round"])
        holder = (
            record if outer_round == record["round"] else read_commit(self.mailbox, fragment, outer_round)
        )
        data = get_blob(self.mailbox, record["outer_state"], self.run.max_payload_bytes(fragment), holder)
        state, _ = payload.unpack(
            data,
            expected_digest=record["outer_state"],
            expect=self.run.expect(kind="outer", fragment=fragment, round=outer_round),
            max_bytes=self.run.max_payload_bytes(fragment),
            expect_shapes=self.run.shapes(fragment),
        )
        return state  # read-only views of the payload: the method's outer step only reads them

    def _commit(self, fragment: int, current: OpenRound, anchor: Arrays, live: set[str]) -> Committed | None:
        version = current.round - 1
        state = self._outer_state(fragment, version, anchor)
        weights = self._weights(current)
        if not current.accepted:  # every contribution was rejected: the anchor, unchanged, no outer step
            accepted, flush_only, params = {}, False, dict(anchor)
            shape = rounds_.round_shape(
                self.rounds, fragment, current.round, contributors=0, live=len(live), steps=[]
            )
        else:
            # An overflow is caught below, as a non-finite result, with its own reason: numpy need not warn.
            with np.errstate(over="ignore", invalid="ignore"):
                try:
                    delta = self.method.combine(
                        self._contributions(fragment, current, l2_norm(self.run.judged(anchor)), weights)
                    )
                except ValueError:
                    return None  # every payload failed its checks: the round closes empty once all reported
                accepted = dict(current.accepted)  # what the merge consumed, less the payloads it rejected
                flush_only = all(record["final"] for record in accepted.values())
                shape = rounds_.round_shape(self.rounds, fragment, current.round, contributors=len(accepted),
                                            live=len(live | set(accepted)),
                                            steps=[current.steps[node] for node in accepted])  # fmt: skip
                params, state = self.method.outer_step(
                    delta, state, anchor, flush_only=flush_only, shape=shape
                )
            del delta  # one fragment less held while the commit is written
        if not _finite(params) or not _finite(state):
            # Each payload was finite, but together they overflow: leave out the largest, try again next turn.
            largest = max(accepted, key=lambda node: current.norms.get(node, 0.0))
            self._reject(current, largest, "merging its Δ made the fragment's parameters non-finite")
            return None
        fields = {"contributors": contributors_of(accepted, weights, current.norms),
                  "rejected": [{"node": node, "reason": why} for node, why in sorted(current.rejected.items())],
                  "merger": self.node_id, "flush_only": flush_only, "live": shape.live, "stale": shape.stale}  # fmt: skip
        written = self.writer.write(fragment, current.round, params, anchor, state, fields, self.head)
        if written is None:
            return None  # that commit is the round's; this node fetches it like any other
        params, record, blob_bytes = written
        known = list(self.head)
        known[fragment] = current.round
        self.move_head(known)
        self.outer_states[fragment] = (current.round, state)
        self.judge.remember(fragment, record["contributors"])
        self.emit(Event("round_merged", self.node_id,
                        f"fragment {fragment} round {current.round} from {len(accepted)} node(s)"
                        + (f", {len(current.rejected)} rejected" if current.rejected else ""),
                        {"fragment": fragment, "round": current.round, "contributors": sorted(accepted),
                         "rejected": dict(current.rejected)}))  # fmt: skip
        named = self.head_written[0][fragment] if self.head_written is not None else 0
        self.housekeeping.committed(fragment, current.round, record, blob_bytes, named)
        del self.open[fragment]
        self.own.forget(known)  # only now: a commit that failed on its way (head.json) is merged again
        release_freed_memory()
        return Committed(fragment, current.round, params, record)


def _finite(arrays: Arrays) -> bool:
    return all(np.isfinite(values).all() for values in arrays.values())


def release_freed_memory() -> None:
    """Hand the memory a commit freed back to the system (glibc's malloc_trim; elsewhere nothing). A commit
    frees a few fragments of arrays each round; glibc keeps them in its heaps, scattered among live ones, so
    without this a merger's resident memory grows by about a model over a run (docs/BENCHMARKS.md,
    session-costs). The call costs about a millisecond, once a commit, on the communication thread."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc() -> "ctypes.CDLL | None":
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (macOS, musl): their allocators return freed memory themselves, or not at all
        return None


_LIBC = _glibc()
