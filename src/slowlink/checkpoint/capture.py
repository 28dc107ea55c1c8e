"""What a checkpoint holds of a session: per fragment Δ_local, the pending counts, the contribution in flight
and the error-feedback residuals, read between two steps on the training thread."""

import time

import numpy as np

from ..arrays import Arrays
from ..errors import MailboxUnavailable
from ..session import Session, _InFlight


def capture(session: Session, upload_timeout: float) -> tuple[dict, Arrays]:
    """The checkpoint's header (JSON) and arrays: `local/<q>/<name>` Δ_local, `in_flight/...` Δ_F when it is
    not Δ_local itself, `residual/...` and `in_flight_residual/...` for error feedback."""
    deadline = time.monotonic() + upload_timeout
    arrays: Arrays = {}
    fragments = []
    courier = session.courier
    for q, names in enumerate(session.plan):
        version, anchor = session._anchors[q]
        local = session.adapter.snapshot(names)
        for name in names:
            np.subtract(anchor[name], local[name], out=local[name])  # Δ_local = Θ_a − θ
            arrays[f"local/{q}/{name}"] = local[name]
        # The residual after the contribution in flight first: once merged, it moves into `residual`.
        flight_residual, residual = courier.residual_in_flight.get(q), courier.residual.get(q)
        entry = {"anchor": version, "pending_steps": session._pending_steps[q],
                 "pending_samples": session._pending_samples[q], "residual": residual is not None,
                 "in_flight": None}  # fmt: skip
        flight = session._in_flight.get(q)
        delta = None if flight is None else flight_delta(session, q, flight, deadline, upload_timeout)
        if flight is not None and delta is None:  # it never went out: the node carries its steps
            entry["pending_steps"] += flight.steps
            entry["pending_samples"] += flight.samples
        elif flight is not None:
            entry["in_flight"] = {"round": flight.round, "snapshot_step": flight.snapshot_step,
                                  "steps": flight.steps, "samples": flight.samples, "delta": delta,
                                  "blob": flight.blob, "residual": flight_residual is not None}  # fmt: skip
            if delta == "stored":
                arrays.update({f"in_flight/{q}/{name}": flight.delta[name] for name in names})
            if flight_residual is not None:
                arrays.update({f"in_flight_residual/{q}/{name}": flight_residual[name] for name in names})
        if residual is not None:
            arrays.update({f"residual/{q}/{name}": residual[name] for name in names})
        fragments.append(entry)
    header = {
        "run": session.run.run_id,
        "node": session.node_id,
        "schema": [[name, list(shape), dtype] for name, shape, dtype in session.adapter.schema],
        "step": session._step,
        "samples": session._samples,
        "schedule_step": session._phase + session._step,
        "owed": sorted(session._owed),
        "fragments": fragments,
    }
    return header, arrays


def flight_delta(
    session: Session, q: int, flight: _InFlight, deadline: float, upload_timeout: float
) -> str | None:
    """Where the in-flight Δ is: "local" when the snapshot is of this very step (Δ_F = Δ_local), "stored" once
    uploaded (the buffer then holds Δ), None when its round committed before it went out. The communication
    thread turns the snapshot into Δ in place while uploading, so in between we wait."""
    if flight.snapshot_step == session._step:
        return "local"
    while True:
        # Read `latest` before `uploaded`: an upload is marked before the commit of its round is fetched.
        committed = session.courier.latest[q][0] >= flight.round
        if flight.uploaded:
            return "stored"
        if committed:
            return None
        if session.courier.failure is not None:
            raise session.courier.failure
        if time.monotonic() >= deadline:
            raise MailboxUnavailable(
                f"fragment {q}'s contribution to round {flight.round} was still being uploaded after "
                f"upload_timeout={upload_timeout}s; no checkpoint was written (the previous one stands). "
                "Save again later, or give sl.checkpoint.save a longer upload_timeout"
            )
        session.courier.wake.set()
        time.sleep(0.005)
