"""Resuming: what loading a checkpoint does to each fragment, planned from the store's commits before anything
changes, then applied to the session (parameters, counts, schedule, contributions in flight)."""

from dataclasses import dataclass

import numpy as np

from ..algorithms import rounds as rounds_
from ..algorithms.rounds import Flight
from ..arrays import Arrays
from ..engine.channel import Contribution
from ..engine.node import Outgoing
from ..events import Event
from ..frameworks.base import on_device_of
from ..protocol import contribution, keys
from ..protocol.run import read_commit
from ..session import Session

SCAN_ROUNDS = 8  # commits after the checkpoint searched for a contribution this node published after the save
NO_ROUND = 1 << 62  # a round no commit reaches: the courier attributes no commit to it


@dataclass
class Resume:
    """What loading does to one fragment; planned (with the store's reads) before anything changes."""

    fragment: int
    delta: Arrays  # Δ_resume: θ ← Θ_v − Δ_resume
    pending_steps: int
    pending_samples: int
    residual: Arrays | None
    flight: Flight | None = None  # a contribution whose round is open
    outgoing: Outgoing | None = None  # its arrays
    flight_residual: Arrays | None = None
    send_again: bool = False  # the contribution never reached the store
    told: str = ""
    behind: tuple[int, int] | None = None  # (round, steps trained after the save that it already holds)


def plan_fragment(session: Session, q: int, entry: dict, arrays: Arrays, saved_step: int) -> Resume:
    names, node, mailbox = session.plan[q], session.node_id, session.mailbox
    delta = {name: arrays[f"local/{q}/{name}"] for name in names}
    residual = group(arrays, "residual", q, names) if entry["residual"] else None
    steps, samples, settled = entry["pending_steps"], entry["pending_samples"], entry["anchor"]
    told = ""
    flight = entry["in_flight"]
    if flight is not None:
        r = flight["round"]
        flight_delta = delta if flight["delta"] == "local" else group(arrays, "in_flight", q, names)
        flight_residual = group(arrays, "in_flight_residual", q, names) if flight["residual"] else None
        # Made before a session.reset(): the parameters do not hold its steps, merged or not (rounds.reset).
        before_reset = flight.get("before_reset") is True
        record = read_commit(mailbox, q, r)
        if record is None:
            stored = stored_contribution(session, q, r)
            restored = Flight(
                r, flight["snapshot_step"], flight["steps"], flight["samples"], None, before_reset
            )
            arrays_ = Outgoing(r, flight_delta, uploaded=True, blob=stored["blob"] if stored else None)
            return Resume(q, delta, steps, samples, residual, restored, arrays_, flight_residual, send_again=not stored,
                          told=f"round {r} in flight" + ("" if stored else ", sent again"))  # fmt: skip
        if contributed(record, node, flight["blob"]):
            if not before_reset:
                delta = {name: delta[name] - flight_delta[name] for name in names}
            residual = flight_residual if flight_residual is not None else residual
            told = f"round {r} merged; "
        elif before_reset:
            told = f"round {r} committed without this node, its steps lost with the reset before the save; "
        else:
            steps, samples = steps + flight["steps"], samples + flight["samples"]
            told = f"round {r} committed without this node, its steps carried; "
        settled = r
    # A contribution this node published after the save holds all of Δ_resume: the first one decides.
    for round_ in range(settled + 1, settled + 1 + SCAN_ROUNDS):
        record = read_commit(mailbox, q, round_)
        if record is None:
            later = stored_contribution(session, q, round_)
            if later is None:
                break
            ghost = Flight(round_, saved_step, steps, samples)
            arrays_ = Outgoing(round_, delta, uploaded=True, blob=later["blob"])
            return Resume(q, delta, 0, 0, None, ghost, arrays_, told=f"{told}round {round_} in flight, published after the save",
                          behind=(round_, max(0, later["steps"] - steps)))  # fmt: skip
        mine = [c for c in record["contributors"] if isinstance(c, dict) and c.get("node") == node]
        if mine:
            zeros = {name: np.zeros_like(values) for name, values in delta.items()}
            return Resume(q, zeros, 0, 0, None, told=f"{told}round {round_} merged, published after the save",
                          behind=(round_, max(0, mine[0].get("steps", 0) - steps)))  # fmt: skip
    return Resume(q, delta, steps, samples, residual, told=told.removesuffix("; ") or "nothing in flight")


def stored_contribution(session: Session, q: int, round_: int) -> dict | None:
    """This node's contribution record for the round, as the store holds it (from any life of the node)."""
    run, node = session.run, session.node_id
    found = session.mailbox.get(keys.contribution(q, round_, node), max_bytes=run.max_payload_bytes(q))
    if found is None or found.data is None:
        return None
    return contribution.read(found.data, run, q, round_, node)


def apply(session: Session, header: dict, resumes: list[Resume]) -> None:
    courier, node, on_device = session.courier, session.node, on_device_of(session.adapter)
    for resume in resumes:
        q = resume.fragment
        _, anchor = node.anchors[q]
        delta = on_device(resume.delta)  # beside the anchor, which is where the model is
        session.adapter.assign({name: anchor[name] - delta[name] for name in anchor})
        if resume.residual is not None:
            courier.residual[q] = resume.residual
        else:
            courier.residual.pop(q, None)
    node.state = rounds_.resumed(
        node.state, step=header["step"], samples=header["samples"],
        schedule_step=schedule_step(session, header["schedule_step"], resumes), owed=header["owed"],
        pending=[(r.pending_steps, r.pending_samples) for r in resumes],
    )  # fmt: skip
    for resume in resumes:
        if resume.flight is not None:
            restore_flight(session, resume)
    told = "; ".join(f"fragment {r.fragment}: {r.told}" for r in resumes)
    node.emit(Event("checkpoint_loaded", session.node_id, f"resumed at step {header['step']} ({told})",
                        {"step": header["step"]}))  # fmt: skip
    for resume in resumes:
        if resume.behind is not None:
            round_, steps = resume.behind
            node.emit(Event("checkpoint_behind", session.node_id,
                                f"fragment {resume.fragment}: this node published round {round_} after the "
                                f"checkpoint was saved; the {steps} steps it trained after the save will be trained "
                                "again and count twice. Save more often (e.g. at every sync)",
                                {"fragment": resume.fragment, "round": round_, "steps": steps}))  # fmt: skip


def restore_flight(session: Session, resume: Resume) -> None:
    """Put the contribution back in flight; the courier learns what to await, or what became of it."""
    q, flight, courier, node = resume.fragment, resume.flight, session.courier, session.node
    assert flight is not None and resume.outgoing is not None
    resume.outgoing.arrays = on_device_of(session.adapter)(resume.outgoing.arrays)  # where the node's Δ live
    node.outgoing[q] = resume.outgoing
    node.state = rounds_.with_flight(node.state, q, flight)
    if resume.flight_residual is not None:
        courier.residual_in_flight[q] = resume.flight_residual
    if resume.send_again:
        # Its round is open and its contribution never arrived. If the round commits before the courier
        # sends it, the courier drops it and the node carries its steps: it was not merged, so that is right.
        _, anchor = node.anchors[q]
        snapshot = {name: anchor[name] - resume.outgoing.arrays[name] for name in anchor}
        courier.publish(Contribution(fragment=q, step=flight.snapshot_step, base=flight.round - 1, anchor=anchor,
                                     snapshot=snapshot, steps=flight.steps, samples=flight.samples, final=False,
                                     step_seconds=0.0))  # fmt: skip
        return
    # Its contribution is in the store: the courier says whether the commit holds it, if it knows the round.
    # It writes `latest` before it reads `sent`, and we write `sent` before we read `latest`: if we see the
    # commit not fetched yet, the courier will see our round when it fetches it.
    courier.sent[q] = (flight.round, resume.outgoing.blob)
    if courier.latest[q][0] < flight.round:
        return
    record = read_commit(session.mailbox, q, flight.round)
    fate = (
        "merged"
        if record is not None and contributed(record, session.node_id, resume.outgoing.blob)
        else "missed"
    )
    node.state = rounds_.with_flight(node.state, q, flight._replace(fate=fate))
    courier.sent[q] = (NO_ROUND, "")  # the courier may have missed ours: leave no round it would match later
    if fate == "merged" and resume.flight_residual is not None:
        courier.residual[q] = resume.flight_residual
    courier.residual_in_flight.pop(q, None)


def schedule_step(session: Session, saved: int, resumes: list[Resume]) -> int:
    """The node's own schedule step, moved on by whole syncs until no fragment falls due for a round that is
    committed or holds this node's contribution already (where nodes wait for rounds, such a sync would be
    skipped, again and again). Its fragments then fall due at the same steps as before, in phase with the run."""
    sync_every, offsets = session.rounds.sync_every, session.rounds.offsets
    taken = [
        max(session.node.anchors[q][0], session.courier.latest[q][0], r.flight.round if r.flight else 0)
        for q, r in enumerate(resumes)
    ]

    def next_round(step: int, q: int) -> int:
        return max(1, (step - offsets[q]) // sync_every + 1)

    shift = max([0] + [round_ + 1 - next_round(saved, q) for q, round_ in enumerate(taken)])
    while any(next_round(saved + shift * sync_every, q) <= round_ for q, round_ in enumerate(taken)):
        shift += 1
    return saved + shift * sync_every


def contributed(record: dict, node: str, blob: str | None) -> bool:
    """Whether the commit holds this node's contribution; its payload's sha, where both sides name one, tells
    that contribution from one of another life of the node under the same id."""
    return any(
        isinstance(c, dict) and c.get("node") == node and (blob is None or c.get("blob") in (None, blob))
        for c in record["contributors"]
    )


def group(arrays: Arrays, kind: str, q: int, names: list[str]) -> Arrays:
    return {name: arrays[f"{kind}/{q}/{name}"] for name in names}
