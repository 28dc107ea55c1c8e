"""A node's round-keeping as a pure state machine, shared by every method, channel and driver: which
fragments are due at a step, who waits, and what aligning with a commit does to the node's counts.

The state is an immutable value; each function returns a new one with what the driver must do. The driver
(engine/node.py) does it: snapshots, sends, waits, and changes the parameters (research/algorithms.md §2.3).
Steps not yet sent are counted from marks: fragment q has trained `step − step_marks[q]` steps since its
last contribution, so a step moves two numbers, whatever the fragment count.
"""

import statistics
from typing import NamedTuple

from .method import Rounds
from .outer import RoundShape
from .schedule import due_fragments


class Flight(NamedTuple):
    """A contribution awaiting its commit: its round, the step of its snapshot, what it trained since its
    anchor, for a resumed node that read it from the store, what became of it ("merged" or "missed"), and
    whether it was made before a reset (its snapshot is then no longer what the parameters grew from)."""

    round: int
    snapshot_step: int
    steps: int
    samples: int
    fate: str | None = None
    before_reset: bool = False


class NodeState(NamedTuple):
    step: int  # local steps trained since joining (or since the checkpoint's start)
    samples: int
    phase: int  # the run's schedule step at joining: fragments fall due at phase + step
    versions: tuple[int, ...]  # the commit each fragment is aligned with
    step_marks: tuple[int, ...]  # pending steps of fragment q: step − step_marks[q]
    sample_marks: tuple[int, ...]
    flights: tuple[Flight | None, ...]
    owed: frozenset[int]  # fragments due while no in-flight slot was free: published as soon as one is

    def pending_steps(self, fragment: int) -> int:
        return self.step - self.step_marks[fragment]

    def pending_samples(self, fragment: int) -> int:
        return self.samples - self.sample_marks[fragment]

    def in_flight(self) -> int:
        return sum(flight is not None for flight in self.flights)


class Due(NamedTuple):
    """What a step asks of the driver: publish these fragments (in order), report the skipped and deferred."""

    publish: tuple[int, ...] = ()
    skipped: tuple[tuple[int, int], ...] = ()  # (fragment, round): that round was committed already
    deferred: tuple[int, ...] = ()  # due, but every in-flight slot is taken


NOTHING_DUE = Due()


class Alignment(NamedTuple):
    """What aligning with a commit does (docs/DESIGN-NOTES.md, "Aligning with a commit").

    rule: "stale" (an older commit: nothing), "carry_overlap" (θ ← θ + Θ_new − θ_snapshot), "blend"
    (θ ← α·θ + (1−α)·Θ_new) or "carry" (θ ← θ + Θ_new − Θ_old). `late` is the flight that missed its round,
    whose steps the next contribution carries; `replaced` the steps a blend partly replaced; `lost` those
    of a flight made before a reset that missed its round (the parameters no longer hold them)."""

    rule: str
    settled: Flight | None = None
    late: Flight | None = None
    replaced: int = 0
    lost: int = 0


def start(rounds: Rounds, versions: list[int]) -> NodeState:
    """A node joining at these versions takes the run's phase: the step at which the newest commit was due
    (fragment q's k-th sync is at offset_q + k·H), so its fragments fall due when everyone else's do."""
    phase = max(
        [offset + version * rounds.sync_every for offset, version in zip(rounds.offsets, versions, strict=True) if version],
        default=0,
    )  # fmt: skip
    zeros = (0,) * rounds.fragments
    return NodeState(0, 0, phase, tuple(versions), zeros, zeros, (None,) * rounds.fragments, frozenset())


def advance(state: NodeState, samples: int) -> NodeState:
    """One local step trained on `samples`."""
    # Built field by field rather than by _replace: this runs at every step, and _replace is slower.
    return NodeState(state.step + 1, state.samples + samples, state.phase, state.versions, state.step_marks,
                     state.sample_marks, state.flights, state.owed)  # fmt: skip


def take_due(rounds: Rounds, state: NodeState) -> tuple[NodeState, Due]:
    """The fragments to publish at this step. Where nodes wait for rounds (overlap_steps set), a sync whose
    round, by the schedule, is already committed is skipped and its steps go into the next one: a node that
    joined mid-round would otherwise be a round ahead of the others, each waiting on the other."""
    step = state.phase + state.step
    if step % rounds.sync_every not in rounds.phases and not state.owed:
        return state, NOTHING_DUE  # most steps: one division and one set lookup
    due = due_fragments(step, rounds.sync_every, rounds.offsets)
    if not due and not state.owed:
        return state, NOTHING_DUE
    if rounds.overlap_steps is not None:
        fresh, skipped = [], []
        for fragment in due:
            round_ = (step - rounds.offsets[fragment]) // rounds.sync_every
            if state.versions[fragment] >= round_:
                skipped.append((fragment, round_))
            else:
                fresh.append(fragment)
        due = fresh
    else:
        skipped = []
    owed, publish = set(state.owed) | set(due), []
    for fragment in sorted(owed):
        if state.flights[fragment] is not None or state.in_flight() >= rounds.in_flight:
            continue
        owed.discard(fragment)
        if state.pending_steps(fragment) > 0:  # a commit may have replaced every step since the last sync
            state = send(state, fragment)
            publish.append(fragment)
    state = state._replace(owed=frozenset(owed))
    deferred = tuple(fragment for fragment in due if fragment in owed)
    return state, Due(tuple(publish), tuple(skipped), deferred)


def send(state: NodeState, fragment: int) -> NodeState:
    """Fragment's pending steps leave in a contribution to the round after its version."""
    flight = Flight(
        state.versions[fragment] + 1,
        state.step,
        state.pending_steps(fragment),
        state.pending_samples(fragment),
    )
    return state._replace(
        flights=_put(state.flights, fragment, flight),
        step_marks=_put(state.step_marks, fragment, state.step),
        sample_marks=_put(state.sample_marks, fragment, state.samples),
    )


def must_wait(rounds: Rounds, state: NodeState) -> bool:
    """The τ barrier: a contribution made τ or more steps ago is not yet committed."""
    tau = rounds.overlap_steps
    return tau is not None and any(
        flight is not None and state.step - flight.snapshot_step >= tau for flight in state.flights
    )


def held(rounds: Rounds, state: NodeState, fragment: int, version: int) -> bool:
    """Whether a commit of the round in flight waits to be applied: with overlap τ it is applied at the τ-th
    step after the snapshot exactly, however early it arrives, so a run does not depend on its timing."""
    flight = state.flights[fragment]
    return (
        rounds.overlap_steps is not None
        and flight is not None
        and flight.round == version
        and state.step - flight.snapshot_step < rounds.overlap_steps
    )


def arrive(
    rounds: Rounds, state: NodeState, fragment: int, version: int, mine: str | None
) -> tuple[NodeState, Alignment]:
    """Align `fragment` with commit `version`; `mine` says whether it holds this node's contribution in
    flight ("merged"), does not ("missed"), or the channel does not know (None: there was none). Without a
    barrier, a fragment whose contribution missed its round is owed: published again at the next step."""
    if version <= state.versions[fragment]:
        return state, Alignment("stale")
    flight = state.flights[fragment]
    if flight is not None and flight.round > version:
        flight = None  # still waiting for a later round
    merged = flight is not None and (flight.fate or mine) == "merged"
    step_marks, sample_marks, owed = state.step_marks, state.sample_marks, state.owed
    if flight is not None and flight.before_reset:
        # The parameters were set to Θ_old at the reset and grew from there: carry, whatever the flight's fate.
        alignment = Alignment("carry", settled=flight, lost=0 if merged else flight.steps)
    elif merged and rounds.mixing is None:
        alignment = Alignment("carry_overlap", settled=flight)
    elif merged:
        alignment = Alignment("blend", settled=flight, replaced=state.pending_steps(fragment))
        if rounds.mixing == 0:  # the steps since the snapshot are replaced: none is left to send
            step_marks = _put(step_marks, fragment, state.step)
            sample_marks = _put(sample_marks, fragment, state.samples)
    else:
        alignment = Alignment("carry", settled=flight, late=flight)
        if flight is not None:  # its steps go into the next contribution
            step_marks = _put(step_marks, fragment, step_marks[fragment] - flight.steps)
            sample_marks = _put(sample_marks, fragment, sample_marks[fragment] - flight.samples)
            if rounds.overlap_steps is None and (flight.fate or mine) == "missed":
                # Re-anchored: it goes out at the next step, into the round this commit opened, rather than
                # a sync later, when that round may have closed again (docs/decoupled.md, "Late contributions").
                owed = owed | {fragment}
    flights = _put(state.flights, fragment, None) if flight is not None else state.flights
    state = state._replace(
        versions=_put(state.versions, fragment, version), step_marks=step_marks, sample_marks=sample_marks,
        flights=flights, owed=owed,
    )  # fmt: skip
    return state, alignment


def refused(state: NodeState, fragment: int) -> tuple[NodeState, int]:
    """The channel did not publish the fragment's contribution in flight: its steps go back to the pending
    ones, or, if it was made before a reset, are lost (their count is returned)."""
    flight = state.flights[fragment]
    state = state._replace(flights=_put(state.flights, fragment, None))
    if flight.before_reset:
        return state, flight.steps
    return state._replace(
        step_marks=_put(state.step_marks, fragment, state.step_marks[fragment] - flight.steps),
        sample_marks=_put(state.sample_marks, fragment, state.sample_marks[fragment] - flight.samples),
    ), 0


def reset(state: NodeState) -> tuple[NodeState, int]:
    """The node's parameters were set back to its commits (session.reset()): the steps not yet sent are
    dropped (their count is returned, to be reported), and each contribution in flight is marked as made
    before the reset, for `arrive`: its commit is carried, and if it does not hold it, its steps are lost."""
    dropped = dropped_steps(state)
    fragments = len(state.versions)
    flights = tuple(
        None if flight is None else flight._replace(before_reset=True) for flight in state.flights
    )
    state = state._replace(
        step_marks=(state.step,) * fragments, sample_marks=(state.samples,) * fragments, flights=flights
    )
    return state, dropped


def unsent(state: NodeState) -> list[int]:
    """Fragments with steps not yet sent and no contribution in flight: what flush_on_close publishes. Steps
    that reported no samples are left out (a merger rejects them): leaving reports them as dropped."""
    return [q for q in range(len(state.versions))
            if state.flights[q] is None and state.pending_steps(q) > 0 and state.pending_samples(q) > 0]  # fmt: skip


def dropped_steps(state: NodeState) -> int:
    return sum(state.pending_steps(q) for q in range(len(state.versions)))


def resumed(
    state: NodeState,
    *,
    step: int,
    samples: int,
    schedule_step: int,
    owed: list[int],
    pending: list[tuple[int, int]],
) -> NodeState:
    """A node resumed from a checkpoint at `step`: its pending counts and schedule as saved, nothing in flight
    (with_flight puts back what was)."""
    return state._replace(
        step=step, samples=samples, phase=schedule_step - step, owed=frozenset(owed),
        step_marks=tuple(step - steps for steps, _ in pending), sample_marks=tuple(samples - count for _, count in pending),
        flights=(None,) * len(state.flights),
    )  # fmt: skip


def with_flight(state: NodeState, fragment: int, flight: Flight) -> NodeState:
    return state._replace(flights=_put(state.flights, fragment, flight))


# ---- the reducing side: when a round closes, and what it commits ----------------------------------------


def quorum_reached(rounds: Rounds, accepted: int) -> bool:
    return accepted >= rounds.quorum_size


def grace_seconds(rounds: Rounds, step_seconds: list[float]) -> float:
    """How long a round with its quorum waits for the other live nodes: `grace_seconds`, or, adaptive, half a
    sync (H/2 steps) at the contributors' median step time, at most 30 s. Nodes of equal speed drift apart
    in phase; a window of half the fragment's period takes every node less than half a period behind into
    the round, where a shorter one let two drifting nodes commit alternate rounds alone, each with half
    the weight (docs/decoupled.md, "Phase")."""
    if rounds.grace_seconds is not None:
        return rounds.grace_seconds
    return min(30.0, 0.5 * rounds.sync_every * statistics.median(step_seconds))


def round_shape(
    rounds: Rounds, fragment: int, round_: int, *, contributors: int, live: int, steps: list[int]
) -> RoundShape:
    """The shape of a round the merger commits. Without a barrier, a round whose contributions span more
    steps than its sync on average (H, and the fragment's offset more for its first round) holds steps
    trained before the previous commit was seen: it is stale."""
    expected = rounds.sync_every + (rounds.offsets[fragment] if round_ == 1 else 0)
    stale = rounds.overlap_steps is None and bool(steps) and sum(steps) > expected * len(steps)
    return RoundShape(contributors=contributors, live=max(live, contributors), stale=stale)


def closes(*, every_live_node_reported: bool, quorum_since: float | None, now: float, grace: float) -> bool:
    """A round closes once every live node has reported, or its quorum has waited out the grace window."""
    return every_live_node_reported or (quorum_since is not None and now - quorum_since >= grace)


def _put(values: tuple, index: int, value: object) -> tuple:
    return values[:index] + (value,) + values[index + 1 :]
