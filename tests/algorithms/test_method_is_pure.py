"""A method is a pure value: its functions read their inputs and state and return new ones, never changing
what they were given (the outer step that once updated its "frozen" momentum in place applied it twice)."""

import dataclasses

import numpy as np
import pytest

import slowlink as sl
from slowlink.algorithms import rounds
from slowlink.algorithms.method import Method


def arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(size=(3, 2)).astype(np.float32), "b": rng.normal(size=2).astype(np.float32)}


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("flush_only", [False, True])
def test_the_outer_step_changes_neither_its_inputs_nor_its_state(momentum, flush_only):
    method = sl.DiLoCo(sync_every=4, outer_momentum=momentum)
    anchor, delta = arrays(0), arrays(1)
    state = method.outer_step(arrays(2), method.init_state(anchor), anchor, flush_only=False)[1]
    copies = [{name: values.copy() for name, values in a.items()} for a in (anchor, delta, state)]
    params, after = method.outer_step(delta, state, anchor, flush_only=flush_only)
    for given, copy in zip((anchor, delta, state), copies, strict=True):
        assert all(np.array_equal(given[name], copy[name]) for name in copy)
    assert all(
        not np.shares_memory(params[name], given[name]) for given in (anchor, delta) for name in params
    )
    # The same inputs give the same result: nothing was consumed.
    again = method.outer_step(delta, state, anchor, flush_only=flush_only)[0]
    assert all(np.array_equal(params[name], again[name]) for name in params)
    if momentum and not flush_only:
        assert not all(np.array_equal(after[name], state[name]) for name in state)


def test_a_method_is_frozen_and_satisfies_the_protocol():
    method = sl.DiLoCo(sync_every=4, fragments=2)
    assert isinstance(method, Method)
    with pytest.raises(dataclasses.FrozenInstanceError):
        method.sync_every = 8  # type: ignore[misc]


def test_the_round_keeping_returns_new_states_and_leaves_the_old_ones_as_they_were():
    plan = sl.DiLoCo(sync_every=2, fragments=2, overlap_steps=1).rounds(2)
    start = rounds.start(plan, [0, 0])
    state = rounds.advance(start, 4)
    state, due = rounds.take_due(plan, rounds.advance(state, 4))  # step 2: fragment 0 is due (offsets 0, 1)
    assert due.publish == (0,) and state.flights[0] is not None
    assert start.step == 0 and start.flights == (None, None)  # the old value is untouched
    assert rounds.must_wait(plan, rounds.advance(state, 4))  # τ = 1 step later, round 1 is still open
    held = rounds.held(plan, state, 0, 1)
    assert held  # a commit of round 1 arriving at the snapshot's step waits for the τ-th step
    after, alignment = rounds.arrive(plan, rounds.advance(state, 4), 0, 1, "merged")
    assert alignment.rule == "carry_overlap" and after.flights[0] is None and state.flights[0] is not None


def test_a_reset_drops_the_pending_steps_and_carries_the_contribution_in_flight_whatever_its_fate():
    # H = 2, one fragment: steps 1-2 are in flight for round 1, step 3 is pending, then the model is reset.
    plan = sl.DiLoCo(sync_every=2).rounds(1)
    state = rounds.advance(rounds.advance(rounds.start(plan, [0]), 4), 4)
    state, due = rounds.take_due(plan, state)
    state = rounds.advance(state, 4)
    assert due.publish == (0,) and state.pending_steps(0) == 1
    reset, dropped = rounds.reset(state)
    assert dropped == 1 and reset.pending_steps(0) == 0 and reset.flights[0].before_reset
    # Merged: its steps are the run's; the parameters grew from Θ_old, so the commit is carried.
    merged, alignment = rounds.arrive(plan, reset, 0, 1, "merged")
    assert (alignment.rule, alignment.lost, merged.pending_steps(0), merged.flights) == (
        "carry",
        0,
        0,
        (None,),
    )
    # Missed or rejected: the parameters no longer hold its 2 steps, so they are lost, not carried.
    missed, alignment = rounds.arrive(plan, reset, 0, 1, "rejected")
    assert (alignment.rule, alignment.late, alignment.lost, missed.pending_steps(0)) == ("carry", None, 2, 0)


def test_a_refused_contribution_gives_its_steps_back_unless_made_before_a_reset():
    plan = sl.DiLoCo(sync_every=2).rounds(1)
    state, _ = rounds.take_due(plan, rounds.advance(rounds.advance(rounds.start(plan, [0]), 4), 4))
    back, lost = rounds.refused(state, 0)
    assert (lost, back.flights, back.pending_steps(0), back.pending_samples(0)) == (0, (None,), 2, 8)
    gone, lost = rounds.refused(rounds.reset(state)[0], 0)
    assert (lost, gone.flights, gone.pending_steps(0)) == (2, (None,), 0)
