"""Honest mistakes leave a run in good order: Ctrl-C twice still releases the leadership and the lease, and
a join whose newest parameters blob is gone starts from an older kept commit, or says what to do."""

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import slowlink as sl
from slowlink.protocol import keys, records
from slowlink.protocol.run import newest_versions, read_commit

from .nodes import batches, sgd_step, tiny_mlp

NODE = Path(__file__).with_name("interrupted_node.py")


def test_ctrl_c_twice_still_releases_the_leadership_and_the_lease(tmp_path):
    path = tmp_path / "run"
    child = subprocess.Popen([sys.executable, str(NODE), str(path)], stdout=subprocess.PIPE, text=True,
                             env=os.environ | {"PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "leading"
        child.send_signal(signal.SIGINT)
        time.sleep(0.3)  # leaving has begun: the communication thread is in a 0.4 s request
        child.send_signal(signal.SIGINT)
        child.wait(timeout=90)  # leaving takes a few 0.4 s requests; a hang takes forever
    finally:
        child.kill()
    mailbox = sl.DirMailbox(path)
    leader = records.decode(mailbox.get(keys.LEADER).data, records.LEADER_FIELDS, what=keys.LEADER)
    assert leader["node"] == "", "leader.json still names the interrupted node: the run would stall a lease"
    assert mailbox.get(keys.node("a")) is None


def test_a_join_whose_newest_parameters_blob_is_gone_starts_from_an_older_commit(blobs_apart):
    mailbox = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=1)
    resume, done = threading.Event(), threading.Event()

    def live_node() -> None:  # holds the newest parameters in memory, as the run's live nodes do
        model = tiny_mlp()
        with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="live", poll_seconds=0.005) as s:
            for step, batch in enumerate(batches(0, 30)):
                if step == 6:
                    done.set()
                    resume.wait(30)
                sgd_step(model, batch, 0.1)
                s.step(samples=4)

    thread = threading.Thread(target=live_node)
    thread.start()
    assert done.wait(30)
    time.sleep(0.2)  # its last round commits
    [newest] = newest_versions(mailbox, 1)
    mailbox.delete([keys.blob(read_commit(mailbox, 0, newest)["params"])])
    model = tiny_mlp(seed=5)
    with sl.Session(
        model, algorithm=algorithm, mailbox=mailbox, node_id="late", poll_seconds=0.005
    ) as session:
        assert session.stats.versions == (newest - 1,)
        resume.set()
        for batch in batches(3, 40):  # it trains, and catches up with the commits that follow
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
            time.sleep(0.005)
    thread.join(30)
    assert session.stats.versions[0] > newest
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_join_with_no_kept_parameters_left_says_what_to_do(blobs_apart):
    mailbox = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=1)
    model = tiny_mlp()
    with sl.Session(
        model, algorithm=algorithm, mailbox=mailbox, node_id="early", poll_seconds=0.005
    ) as session:
        # Until the kept commits no longer reach back to the initial model, always kept. Steps outpace the
        # communication thread on a busy machine, so a fixed number of steps may leave fewer commits.
        for batch in itertools.islice(itertools.cycle(batches(0, 40)), 20_000):
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
            if newest_versions(mailbox, 1)[0] >= 6:
                break
    [newest] = newest_versions(mailbox, 1)
    assert newest >= 6
    mailbox.delete([keys.blob(read_commit(mailbox, 0, r)["params"]) for r in range(newest - 3, newest + 1)])
    with pytest.raises(sl.PayloadError, match="join again, or restore the missing blobs"):
        with sl.Session(tiny_mlp(), algorithm=algorithm, mailbox=mailbox, node_id="late"):
            pass
