"""Records that cannot be read (garbled here; unsigned or forged in a signed run) do not stop a run:
an unreadable leader.json is taken over at once, and an unreadable head.json is rebuilt from the commits."""

import os
import stat
import time

import slowlink as sl
from slowlink.protocol import keys
from slowlink.protocol.run import read_commit, read_head

from .nodes import batches, sgd_step, tiny_mlp


def train_until(sessions, models, condition, *, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    data = [batches(i, 5000) for i in range(len(models))]
    step = 0
    while not condition():
        assert time.monotonic() < deadline, "the run stopped making progress"
        for i, (session, model) in enumerate(zip(sessions, models, strict=True)):
            sgd_step(model, data[i][step], 0.05)
            session.step(samples=4)
        step += 1
        time.sleep(0.005)


def test_a_garbled_leader_record_is_taken_over_and_rounds_go_on():
    mailbox = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=2)
    models = [tiny_mlp(), tiny_mlp()]
    options = {"algorithm": algorithm, "mailbox": mailbox, "poll_seconds": 0.005, "lease_seconds": 8.0}
    with (
        sl.Session(models[0], node_id="a", **options) as a,
        sl.Session(models[1], node_id="b", **options) as b,
    ):
        train_until([a, b], models, lambda: read_commit(mailbox, 0, 2) is not None)
        mailbox.put(keys.LEADER, b"\x00garbled")
        taken_at = time.monotonic()
        train_until([a, b], models, lambda: read_commit(mailbox, 0, 6) is not None)  # rounds go on meanwhile
        # Replaced within a lease, not after one: by the leader at its next renewal (a quarter lease on), or by
        # a follower that reads it first and takes over at once (create-once commits keep two leaders harmless).
        train_until([a, b], models, lambda: mailbox.get(keys.LEADER).data != b"\x00garbled")
        train_until([a, b], models, lambda: a.stats.is_leader != b.stats.is_leader)
        assert time.monotonic() - taken_at < 8.0


def test_a_garbled_head_record_is_rebuilt_from_the_commits():
    mailbox = sl.MemoryMailbox()
    models = [tiny_mlp()]
    with sl.Session(models[0], algorithm=sl.DiLoCo(sync_every=2), mailbox=mailbox, node_id="a",
                    poll_seconds=0.005) as a:  # fmt: skip
        train_until([a], models, lambda: read_commit(mailbox, 0, 2) is not None)
        mailbox.put(keys.HEAD, b"{garbled")
        train_until(
            [a], models, lambda: readable_head(mailbox) >= 5
        )  # rewritten from the commits, and moving
        train_until([a], models, lambda: a.stats.versions[0] >= 5)


def readable_head(mailbox) -> int:
    try:
        return read_head(mailbox, 1)[0][0]
    except sl.PayloadError:
        return -1


def test_a_fifo_and_a_link_in_place_of_head_and_leader_records_do_not_stop_a_directory_run(tmp_path):
    # Over a directory the records can be replaced by what no node writes: a FIFO (whose open would wait
    # forever) and a link to a file outside the run (which a write must not reach). Both read as absent,
    # so the run re-creates head.json and leader.json, and goes on.
    mailbox = sl.DirMailbox(tmp_path / "run")
    outside = tmp_path / "outside.txt"
    outside.write_text("not the run's")
    models = [tiny_mlp(), tiny_mlp()]
    options = {"algorithm": sl.DiLoCo(sync_every=2), "mailbox": mailbox, "poll_seconds": 0.005}
    with (
        sl.Session(models[0], node_id="a", lease_seconds=8.0, **options) as a,
        sl.Session(models[1], node_id="b", lease_seconds=8.0, **options) as b,
    ):
        # head.json is a hint, first written once a fragment is a few commits on
        train_until([a, b], models, lambda: (mailbox.path / keys.HEAD).exists())
        (mailbox.path / keys.HEAD).unlink()
        os.mkfifo(mailbox.path / keys.HEAD)
        (mailbox.path / keys.LEADER).unlink()
        (mailbox.path / keys.LEADER).symlink_to(outside)
        train_until([a, b], models, lambda: read_commit(mailbox, 0, 6) is not None)
        train_until([a, b], models, lambda: readable_head(mailbox) >= 5)
        # leader.json, read as absent, is written again at the leader's next renewal (a quarter lease on).
        train_until([a, b], models, lambda: stat.S_ISREG(os.lstat(mailbox.path / keys.LEADER).st_mode))
    assert outside.read_text() == "not the run's"
    for key in (keys.HEAD, keys.LEADER):
        assert stat.S_ISREG(os.lstat(mailbox.path / key).st_mode)
