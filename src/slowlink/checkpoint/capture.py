"""What a checkpoint holds of a session: per fragment Δ_local, the pending counts, the contribution in flight
(marked if it was made before a session.reset()) and the error-feedback residuals, read between two steps on
the training thread."""

from ..algorithms.rounds import Flight
from ..arrays import Arrays, subtract_into
from ..engine.node import Outgoing
from ..errors import MailboxUnavailable
from ..frameworks.base import host_arrays, local_of
from ..session import Session


def capture(session: Session, upload_timeout: float) -> tuple[dict, Arrays]:
    """The checkpoint's header (JSON) and arrays: `local/<q>/<name>` Δ_local, `in_flight/...` Δ_F when it is
    not Δ_local itself, `residual/...` and `in_flight_residual/...` for error feedback, and `own/<name>` each
    tensor the node keeps to itself (integer buffers such as BatchNorm's num_batches_tracked), as it is."""
    deadline = session.clock.now() + upload_timeout
    arrays: Arrays = {}
    fragments = []
    courier, node = session.courier, session.node
    state, clone = node.state, getattr(session.adapter, "clone", None)
    for q, names in enumerate(session.plan):
        version, anchor = node.anchors[q]
        local = clone(names) if clone is not None else session.adapter.snapshot(names)  # where the anchor is
        for name in names:
            subtract_into(anchor[name], local[name])  # Δ_local = Θ_a − θ
        arrays.update(keyed("local", q, local))
        # The residual after the contribution in flight first: once merged, it moves into `residual`.
        flight_residual, residual = courier.residual_in_flight.get(q), courier.residual.get(q)
        entry = {"anchor": version, "pending_steps": state.pending_steps(q),
                 "pending_samples": state.pending_samples(q), "residual": residual is not None,
                 "in_flight": None}  # fmt: skip
        flight, outgoing = state.flights[q], node.outgoing.get(q)
        delta = (
            None if flight is None else flight_delta(session, q, flight, outgoing, deadline, upload_timeout)
        )
        if flight is not None and delta is None:  # it never went out: the node carries its steps
            if not flight.before_reset:  # (one made before a reset left the parameters with the reset)
                entry["pending_steps"] += flight.steps
                entry["pending_samples"] += flight.samples
        elif flight is not None:
            entry["in_flight"] = {"round": flight.round, "snapshot_step": flight.snapshot_step,
                                  "steps": flight.steps, "samples": flight.samples, "delta": delta,
                                  "blob": outgoing.blob, "residual": flight_residual is not None,
                                  "before_reset": flight.before_reset}  # fmt: skip
            if delta == "stored":
                arrays.update(keyed("in_flight", q, outgoing.arrays))
            if flight_residual is not None:
                arrays.update(keyed("in_flight_residual", q, flight_residual))
        if residual is not None:
            arrays.update(keyed("residual", q, residual))
        fragments.append(entry)
    stored = {(q, entry["in_flight"]["round"]) for q, entry in enumerate(fragments)
              if entry["in_flight"] is not None and entry["in_flight"]["delta"] == "stored"}  # fmt: skip
    store_kept(session, stored, deadline, upload_timeout)
    arrays.update({f"own/{name}": values for name, values in local_of(session.adapter).items()})
    header = {
        "run": session.run.run_id,
        "node": session.node_id,
        "schema": [[name, list(shape), dtype] for name, shape, dtype in session.adapter.schema],
        "step": state.step,
        "samples": state.samples,
        "schedule_step": state.phase + state.step,
        "owed": sorted(state.owed),
        "fragments": fragments,
    }
    return header, arrays


def keyed(kind: str, q: int, values: dict) -> Arrays:
    """`values` (on the model's device or on host) as host arrays under their keys `kind/q/name`."""
    return {f"{kind}/{q}/{name}": array for name, array in host_arrays(values).items()}


def store_kept(
    session: Session, stored: set[tuple[int, int]], deadline: float, upload_timeout: float
) -> None:
    """A merger keeps its own contributions in memory rather than in the store. The checkpoint counts those in
    flight as sent (`stored`: (fragment, round)), and a restart looks for them in the store: so have the
    communication thread write them there first."""
    courier, own = session.courier, session.courier.merger.own
    if not stored & (set(own.kept) - own.stored):
        return
    own.wanted.set()
    courier.wake.set()
    while own.wanted.is_set():
        if courier.failure is not None:
            raise courier.failure
        if session.clock.now() >= deadline:
            raise MailboxUnavailable(
                f"the contributions this merger kept in memory were not written to the store within "
                f"upload_timeout={upload_timeout}s; no checkpoint was written (the previous one stands). "
                "Save again later, or give sl.checkpoint.save a longer upload_timeout"
            )
        session.clock.sleep(0.005)


def flight_delta(
    session: Session, q: int, flight: Flight, outgoing: Outgoing, deadline: float, upload_timeout: float
) -> str | None:
    """Where the in-flight Δ is: "local" when the snapshot is of this very step (Δ_F = Δ_local), "stored" once
    uploaded (the buffer then holds Δ), None when its round committed before it went out. The communication
    thread turns the snapshot into Δ in place while uploading, so in between we wait."""
    if flight.snapshot_step == session.node.state.step and not flight.before_reset:
        return "local"  # (after a reset at this very step, the parameters are no longer the snapshot)
    while True:
        # Read `latest` before `uploaded`: an upload is marked before the commit of its round is fetched.
        committed = session.courier.latest[q][0] >= flight.round
        if outgoing.uploaded:
            return "stored"
        if committed:
            return None
        if session.courier.failure is not None:
            raise session.courier.failure
        if session.clock.now() >= deadline:
            raise MailboxUnavailable(
                f"fragment {q}'s contribution to round {flight.round} was still being uploaded after "
                f"upload_timeout={upload_timeout}s; no checkpoint was written (the previous one stands). "
                "Save again later, or give sl.checkpoint.save a longer upload_timeout"
            )
        session.courier.wake.set()
        session.clock.sleep(0.005)
