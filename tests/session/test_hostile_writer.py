"""Someone who can write to a signed run's store but has no key cannot wedge it: junk and squatted keys
are skipped or replaced, replayed records count for nothing, and a run is never created over another's
history. Each case runs against a directory and moto's S3 server."""

import time

import pytest

import slowlink as sl
from slowlink.protocol import keys, records
from slowlink.protocol.run import read_commit
from slowlink.protocol.trust import RunKey, Signed

from .nodes import batches, sgd_step, tiny_mlp

KEY = "k" * 32


def view(mailbox, key: str = KEY) -> Signed:
    """The store as a node with the key sees it, bound to its run."""
    signed = Signed(mailbox, RunKey(key))
    signed.get(keys.RUN)
    return signed


def train_until(session, model, version: int, *, seconds: float = 30.0, tamper=None) -> int:
    """Train (H=1) until fragment 0 reaches `version`; `tamper(step)` runs before each step."""
    deadline = time.monotonic() + seconds
    for step, batch in enumerate(batches(0, 100_000)):
        if tamper is not None:
            tamper(step)
        sgd_step(model, batch, 0.05)
        session.step(samples=4)
        if session.stats.versions[0] >= version or time.monotonic() > deadline:
            return session.stats.versions[0]
        time.sleep(0.002)
    raise AssertionError("unreachable")


def session(model, mailbox, **options):
    options = {"node_id": "a", "run_key": KEY, "poll_seconds": 0.005, "lease_seconds": 2.0} | options
    return sl.Session(model, algorithm=sl.DiLoCo(sync_every=1), mailbox=mailbox, **options)


def test_junk_head_and_a_far_future_commit_key_do_not_wedge_the_run(store):
    model = tiny_mlp()
    with session(model, store) as s:
        assert train_until(s, model, 2) >= 2

        def tamper(step: int) -> None:
            if step == 0:  # unsigned junk: an empty far-future commit, an unparsable key, a garbage head
                store.put("commits/0000/9999999999.json", b"")
                store.put("commits/0000.json", b"{}")
                store.put(keys.HEAD, b"garbage")

        assert train_until(s, model, 8, tamper=tamper) >= 8
        assert s.courier.failure is None
    head = records.decode(view(store).get(keys.HEAD).data, records.HEAD_FIELDS, what="head")
    assert 8 <= head["versions"][0] < 9999999999  # rebuilt from verified commits, then moved on


def test_junk_written_first_to_the_next_commit_key_is_replaced_and_the_round_commits(store):
    model = tiny_mlp()
    events = []
    with session(model, store, on_event=events.append) as s:
        assert train_until(s, model, 1) >= 1
        squatted = s.stats.versions[0] + 3  # a little ahead: the leader may be a round past what was applied
        for round_ in range(squatted, squatted + 3):  # the next rounds' keys, before any leader writes them
            store.put(
                keys.commit(0, round_), records.encode({"fragment": 0, "round": round_}), if_absent=True
            )
        assert train_until(s, model, squatted + 4) >= squatted + 4
    for round_ in range(squatted, squatted + 3):
        assert read_commit(view(store), 0, round_)["merger"] == "a"  # signed, and ours
    assert sum(e.kind == "record_replaced" for e in events) >= 3


def test_a_signed_leader_record_replayed_every_lease_does_not_stop_merging(store):
    first = tiny_mlp()
    with session(first, store, node_id="b") as s:
        assert train_until(s, first, 2) >= 2
        captured = store.get(keys.LEADER).data  # b's valid, signed leader.json of term 1
    model = tiny_mlp()
    with session(model, store) as s:  # a takes the leadership b released, in a later term
        assert train_until(s, model, 4) >= 4
        replayed_at, replays = [time.monotonic()], [0]

        def tamper(step: int) -> None:
            if time.monotonic() - replayed_at[0] > 0.5:  # a quarter lease: faster than the leader renews
                store.put(keys.LEADER, captured)
                replayed_at[0], replays[0] = time.monotonic(), replays[0] + 1

        # Replays over three leases (a renewal refused a quarter lease apart), and merging goes on through
        # them. Judged by replays and commits, not by commits in a fixed time: on a loaded machine moto's
        # S3 server may take a second a commit (30 commits in 30 s failed once at load 17).
        start, deadline = s.stats.versions[0], time.monotonic() + 120
        while (replays[0] < 12 or s.stats.versions[0] < start + 10) and time.monotonic() < deadline:
            train_until(s, model, s.stats.versions[0] + 1, seconds=5.0, tamper=tamper)
        assert replays[0] >= 12 and s.stats.versions[0] >= start + 10
        assert s.stats.is_leader


def test_a_signed_head_from_another_run_with_the_same_key_is_refused(tmp_path):
    other, this = sl.DirMailbox(tmp_path / "other"), sl.DirMailbox(tmp_path / "this")
    for mailbox, steps in ((other, 40), (this, 3)):
        model = tiny_mlp()
        with session(model, mailbox) as s:
            assert train_until(s, model, steps) >= steps
    this.put(keys.HEAD, other.get(keys.HEAD).data)  # signed with the same key, for run "other"
    with pytest.raises(sl.PayloadError, match="forged signature"):
        view(this).get(keys.HEAD)
    model = tiny_mlp()
    with session(model, this, node_id="b") as s:  # a joiner is not sent 37 rounds into the future
        assert 3 <= s.stats.versions[0] < 40  # the commits of this run, found without the forged head
        assert train_until(s, model, 6) >= 6


def test_junk_lease_files_are_not_live_nodes(store):
    model = tiny_mlp()
    events = []
    algorithm = sl.DiLoCo(sync_every=1, global_batch_size=64)
    with sl.Session(model, algorithm=algorithm, mailbox=store, node_id="a", run_key=KEY, poll_seconds=0.005,
                    lease_seconds=2.0, on_event=events.append) as s:  # fmt: skip
        for i in range(63):
            store.put(keys.node(f"junk-{i}"), records.encode({"node": f"junk-{i}", "beat": i}))
        deadline = time.monotonic() + 30  # each lease listed and read, a quarter lease (0.5 s) apart
        while sum(e.kind == "lease_ignored" for e in events) < 63 and time.monotonic() < deadline:
            s.courier.wake.set()
            time.sleep(0.05)
        assert s.batch_size == 64
        assert s.courier.live_nodes(fresh=True) == {"a"}
    assert sum(e.kind == "lease_ignored" for e in events) >= 63


def test_a_replayed_lease_of_a_node_that_left_does_not_keep_it_live(tmp_path):
    mailbox = sl.DirMailbox(tmp_path / "run")
    with sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=1), mailbox=mailbox, node_id="gone",
                    lease_seconds=1.0, poll_seconds=0.005) as gone:  # fmt: skip
        time.sleep(0.1)
        old_lease = mailbox.get(keys.node("gone")).data
        del gone
    with sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=1), mailbox=mailbox, node_id="a",
                    lease_seconds=1.0, poll_seconds=0.005) as s:  # fmt: skip
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # rewritten with its old content again and again: a replay
            mailbox.put(keys.node("gone"), old_lease)
            time.sleep(0.05)
        assert s.courier.live_nodes(fresh=True) == {"a"}


def test_a_run_is_never_created_over_another_runs_history(store):
    model = tiny_mlp()
    with session(model, store) as s:
        assert train_until(s, model, 2) >= 2
    store.delete([keys.RUN])  # as an S3 lifecycle rule expiring old objects would
    fresh = tiny_mlp(seed=3)
    before = [p.detach().clone() for p in fresh.parameters()]
    with pytest.raises(sl.RunConfigMismatch, match="run.json.*never creates a run over"):
        with session(fresh, store, node_id="b"):
            pass
    assert store.get(keys.RUN) is None
    assert all((a == b).all() for a, b in zip(before, fresh.parameters(), strict=True))


def test_an_unsigned_record_in_a_signed_run_is_reported_as_possibly_forged():
    with pytest.raises(sl.PayloadError, match="may be forged"):
        RunKey(KEY).verify(keys.HEAD, records.encode({"versions": [1]}))
