"""Failures nobody hears no more: a store that fails every request is logged at WARNING (so a default logging
set-up shows it), counted in session.stats, and once no commit has come for a while it is a `stalled`
warning; with on_stall="raise" session.step() raises instead of training alone."""

import logging
import time

import pytest

import slowlink as sl
from slowlink.engine.stall import STALL_POLLS
from slowlink.events import level_of
from slowlink.mailbox.faulty import Faulty

from .nodes import batches, sgd_step, tiny_mlp


def train_on_a_failing_store(events: list, **options) -> sl.Session:
    """One node whose store fails every request once it has joined and a first round of it is merged; it
    trains on until it has stalled, and a few steps more. Another node merges, on a store that does not fail:
    a merger never uploads its own contributions, so only a node that does not merge can fail to."""
    inner = sl.MemoryMailbox()
    store, model = Faulty(inner), tiny_mlp()
    merger = sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=2), mailbox=inner, node_id="m",
                        poll_seconds=0.005, close_timeout=0.2)  # fmt: skip
    session = sl.Session(model, algorithm=sl.DiLoCo(sync_every=2), mailbox=store, node_id="n", poll_seconds=0.005,
                         close_timeout=0.2, on_event=events.append, **options)  # fmt: skip
    with merger, session:
        for batch in batches(0, 2):
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
        deadline = time.monotonic() + 10
        while session.stats.commits_applied == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
            session.step(samples=4)
        store.error_rate = 1.0  # from here on, every request fails
        deadline, more = time.monotonic() + 30, 20
        while more and time.monotonic() < deadline:
            time.sleep(0.002)
            session.step(samples=4)
            more -= any(e.kind == "stalled" for e in events)
    return session


def test_store_failures_are_warnings_counted_in_stats_and_a_long_run_of_them_is_a_stall(caplog):
    caplog.set_level(logging.WARNING, logger="slowlink")
    events = []
    session = train_on_a_failing_store(events)
    assert level_of("mailbox_error") == level_of("upload_failed") == level_of("stalled") == logging.WARNING
    warned = {record.event.kind for record in caplog.records if record.levelno == logging.WARNING}
    assert {"mailbox_error", "upload_failed", "stalled"} <= warned
    stats = session.stats
    assert stats.mailbox_errors == sum(e.kind == "mailbox_error" for e in events) > 0
    assert stats.uploads_failed == sum(e.kind == "upload_failed" for e in events) > 0
    stalled = [e for e in events if e.kind == "stalled"]
    assert stats.stalls == len(stalled) == 1  # said once, not at every failure
    assert stalled[0].data["failures"] >= 3 and stalled[0].data["seconds"] >= STALL_POLLS * 0.005
    assert "trains alone" in stalled[0].message


def test_on_stall_raise_stops_the_training_loop_with_a_clear_error():
    events = []
    with pytest.raises(
        sl.MailboxError, match=r"no commit reached this node for .* on_stall='raise' stops training here"
    ):
        train_on_a_failing_store(events, on_stall="raise")
    assert [e.kind for e in events].count("stalled") == 1


def test_on_stall_raise_also_ends_a_wait_for_a_round():
    # With a barrier (overlap_steps=0) the node waits inside session.step() for its round: the stall ends it.
    store = Faulty(sl.MemoryMailbox())
    model = tiny_mlp()
    with sl.Session(model, algorithm=sl.DiLoCo(sync_every=2, overlap_steps=0), mailbox=store, node_id="n",
                    poll_seconds=0.005, close_timeout=0.2, on_stall="raise") as session:  # fmt: skip
        store.error_rate = 1.0
        session.step(samples=4)
        started = time.monotonic()
        with pytest.raises(sl.MailboxError, match="on_stall='raise'"):
            session.step(samples=4)  # due: published, and waited for
        assert time.monotonic() - started < 10
        # Caught, and the session closed without an exception: leaving tries its best, and says what it left.
    assert not session.is_open and session.stats.steps_unconfirmed == 2


def test_on_stall_takes_warn_or_raise():
    with pytest.raises(sl.ConfigError, match=r"on_stall='loud' must be 'warn' or 'raise'"):
        sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=2), mailbox=sl.MemoryMailbox(), on_stall="loud")
