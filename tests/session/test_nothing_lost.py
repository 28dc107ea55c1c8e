"""Nothing silently lost: rejected contributions, late ones, and steps dropped on leaving are counted,
reported as events through the callback and the "slowlink" logger, and recorded in the commit."""

import json
import logging

import numpy as np
import pytest
import torch
from safetensors.numpy import save

import slowlink as sl
from slowlink.protocol import contribution, keys
from slowlink.protocol.run import read_commit, read_run
from slowlink.wire import payload

from .nodes import batches, sgd_step, tiny_mlp


def plant_contribution(mailbox, node, arrays_for, *, round_=1, fragment=0, samples=4):
    """Write a contribution as another node would, with whatever values `arrays_for(plan)` gives."""
    run = read_run(mailbox)
    claims = {
        "base": round_ - 1,
        "samples": samples,
        "steps": 2,
        "final": False,
        "step_seconds": 0.01,
        "norm": 0.0,
    }
    header = contribution.header(run, fragment, round_, node, claims)
    mailbox.put(keys.contribution(fragment, round_, node), raw_payload(arrays_for(run), header))


def raw_payload(arrays, header):
    """A payload framed as slowlink frames it, but without the encoder's checks: what a bad peer can send."""
    entries = {name: np.ascontiguousarray(values, np.float32).reshape(-1) for name, values in arrays.items()}
    shapes_ = json.dumps({name: list(values.shape) for name, values in arrays.items()})
    metadata = {"format": payload.FORMAT, "encoding": "F32", "shapes": shapes_}
    return save(entries, metadata=metadata | {key: str(value) for key, value in header.items()})


def shapes(run):
    return {name: shape for name, shape, _ in run.schema}


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (lambda run: {n: np.full(s, np.nan, np.float32) for n, s in shapes(run).items()}, "NaN or infinite"),
        (
            lambda run: {n: np.zeros(s, np.float32) for n, s in list(shapes(run).items())[:2]},
            "payload lacks tensor",
        ),
    ],
)
def test_a_bad_contribution_is_rejected_with_its_reason_and_the_round_commits_without_it(bad, reason, caplog):
    mailbox, events = sl.MemoryMailbox(), []
    model = tiny_mlp()
    algorithm = sl.DiLoCo(sync_every=2, overlap_steps=0)
    with caplog.at_level(logging.INFO, logger="slowlink"):
        with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="good", poll_seconds=0.005,
                        on_event=events.append) as session:  # fmt: skip
            plant_contribution(mailbox, "evil", bad)
            for batch in batches(0, 2):
                sgd_step(model, batch, 0.1)
                session.step(samples=4)
            stats = session.stats
    record = read_commit(mailbox, 0, 1)
    assert [c["node"] for c in record["contributors"]] == ["good"]
    assert record["rejected"][0]["node"] == "evil" and reason in record["rejected"][0]["reason"]
    assert stats.contributions_rejected == 1
    assert [e.data["from"] for e in events if e.kind == "contribution_rejected"] == ["evil"]
    assert any(r.levelno == logging.WARNING and "evil" in r.getMessage() for r in caplog.records)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_contribution_that_is_not_a_payload_is_rejected_and_recorded():
    mailbox = sl.MemoryMailbox()
    model = tiny_mlp()
    with sl.Session(model, algorithm=sl.DiLoCo(sync_every=2, overlap_steps=0), mailbox=mailbox, node_id="good",
                    poll_seconds=0.005) as session:  # fmt: skip
        mailbox.put(keys.contribution(0, 1, "junk"), b"\x80not a payload")
        for batch in batches(0, 2):
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
    record = read_commit(mailbox, 0, 1)
    reason = "payload header claims 8079564523522977408 bytes but only 6 follow: truncated"
    assert record["rejected"] == [{"node": "junk", "reason": reason}]


def test_steps_trained_after_the_last_sync_are_counted_as_dropped_or_published_with_flush_on_close():
    for flush, dropped in ((False, 3), (True, 0)):
        mailbox, events = sl.MemoryMailbox(), []
        model = tiny_mlp()
        algorithm = sl.DiLoCo(sync_every=4, flush_on_close=flush, overlap_steps=0)
        with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="n", poll_seconds=0.005,
                        on_event=events.append) as session:  # fmt: skip
            for batch in batches(0, 7):
                sgd_step(model, batch, 0.1)
                session.step(samples=4)
        assert session.stats.steps_dropped == dropped
        assert [e.data["steps"] for e in events if e.kind == "steps_dropped"] == (
            [dropped] if dropped else []
        )
        if flush:
            final = read_commit(mailbox, 0, 2)
            assert final["flush_only"] and final["contributors"][0]["steps"] == 3
        # Leaving aligns the model with the newest commit.
        evaluator = tiny_mlp(seed=9)
        sl.align(evaluator, mailbox=mailbox)
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), evaluator.parameters(), strict=True))


def test_flush_on_close_also_publishes_steps_trained_while_the_last_round_was_in_flight():
    mailbox, events = sl.MemoryMailbox(), []
    model = tiny_mlp()
    algorithm = sl.DiLoCo(sync_every=4, flush_on_close=True)  # no barrier: round 1 may be in flight at close
    with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="n", poll_seconds=0.005,
                    on_event=events.append) as session:  # fmt: skip
        for batch in batches(0, 5):
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
    assert session.stats.steps_dropped == 0
    final = read_commit(mailbox, 0, 2)
    assert final["flush_only"] and [c["steps"] for c in final["contributors"]] == [1]
    assert not [e for e in events if e.kind == "steps_dropped"]


def test_zstd_and_f4_contributions_are_merged_like_any_other():
    from slowlink.wire.compress import is_compressed

    mailbox, sent = sl.MemoryMailbox(), []
    model = tiny_mlp()
    algorithm = sl.DiLoCo(sync_every=2, overlap_steps=0, delta_dtype="F4")

    def on_event(event: sl.Event) -> None:  # the lone node merges: it keeps its payload rather than store it
        if event.kind == "contribution_sent":
            sent.append(session.courier.merger.own.kept[(0, event.data["round"])][1])

    with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="n", poll_seconds=0.005,
                    compression="zstd", on_event=on_event) as session:  # fmt: skip
        for batch in batches(0, 4):
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
    assert len(sent) == 2
    assert all(is_compressed(data) and payload.read_header(data)["encoding"] == "F4" for data in sent)
    assert session.stats.commits_applied == 2 and session.stats.contributions_rejected == 0
    assert [c["node"] for c in read_commit(mailbox, 0, 2)["contributors"]] == ["n"]


def test_a_contribution_still_awaiting_its_commit_at_close_is_unconfirmed_not_dropped():
    mailbox, events = sl.MemoryMailbox(), []
    algorithm = sl.DiLoCo(sync_every=2, quorum_size=2, flush_on_close=True)
    idle = sl.Session(tiny_mlp(), algorithm=algorithm, mailbox=mailbox, node_id="idle", poll_seconds=0.005)
    with idle:  # live, so the round waits for it, but it never trains
        model = tiny_mlp()
        with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="busy", poll_seconds=0.005,
                        close_timeout=0.3, on_event=events.append) as session:  # fmt: skip
            for batch in batches(0, 3):
                sgd_step(model, batch, 0.1)
                session.step(samples=4)
        stats = session.stats
        # The sync's 2 steps went out and may yet be merged; the step after it waited behind them, unpublished.
        assert stats.steps_unconfirmed == 2 and stats.steps_dropped == 1
        [event] = [e for e in events if e.kind == "steps_unconfirmed"]
        assert event.data["rounds"] == [(0, 1)]
        assert mailbox.get(keys.contribution(0, 1, "busy")) is not None  # still there for a later commit
