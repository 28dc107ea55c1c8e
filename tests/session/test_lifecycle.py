"""A session for loops that cannot sit in a `with` block (start/close), and session.batch_size, which
follows the run's membership and, read right after joining, waits for the leases of nodes that started
with this one."""

import pytest

import slowlink as sl

from .nodes import batches, sgd_step, tiny_mlp


def test_start_and_close_join_and_leave_as_with_does():
    model, events = tiny_mlp(), []
    session = sl.Session(model, algorithm=sl.DiLoCo(sync_every=2, overlap_steps=0), mailbox=sl.MemoryMailbox(),
                         node_id="n", poll_seconds=0.005, on_event=events.append)  # fmt: skip
    assert session.start() is session and session.is_open
    for batch in batches(0, 4):
        sgd_step(model, batch, 0.1)
        session.step(samples=4)
    session.close()
    assert not session.is_open and session.stats.commits_applied == 2
    assert "run_created" in [e.kind for e in events] and events[-1].kind == "left"
    session.close()  # closing again does nothing
    assert [e.kind for e in events].count("left") == 1
    with pytest.raises(sl.SessionStateError, match="entered once"):
        session.start()
    with pytest.raises(sl.SessionStateError, match="outside"):
        session.step()


def test_batch_size_read_right_after_joining_counts_a_node_that_started_at_the_same_time(tmp_path):
    algorithm = sl.DiLoCo(sync_every=2, global_batch_size=16)
    options = dict(algorithm=algorithm, mailbox=tmp_path / "run", poll_seconds=0.005, lease_seconds=4.0)
    with (
        sl.Session(tiny_mlp(), node_id="a", **options) as a,
        sl.Session(tiny_mlp(), node_id="b", **options) as b,
    ):
        # `a` joined first, and had not seen b's lease yet: without the wait it said 16, the whole batch.
        assert a.batch_size == 8 and b.batch_size == 8
    with sl.Session(tiny_mlp(), node_id="alone", **options) as alone:
        assert alone.batch_size == 16


def test_batch_size_needs_the_global_batch_and_an_open_session():
    session = sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=2, global_batch_size=16),
                         mailbox=sl.MemoryMailbox())  # fmt: skip
    with pytest.raises(sl.SessionStateError, match="entered"):
        _ = session.batch_size
    with sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=2), mailbox=sl.MemoryMailbox()) as other:
        with pytest.raises(sl.ConfigError, match="global_batch_size"):
            _ = other.batch_size
