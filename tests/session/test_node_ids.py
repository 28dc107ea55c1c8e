"""One node id, one live process: a second process started under an id that is live is refused with an
error naming the id and the fix, while a node restarted after a crash rejoins under its id; the leader
sweeps leases left behind by nodes that crashed."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import slowlink as sl
from slowlink.mailbox.faulty import Faulty
from slowlink.protocol import keys, records
from slowlink.protocol.leases import beat_seconds, refuse_if_live

from .nodes import tiny_mlp

NODE = Path(__file__).with_name("interrupted_node.py")  # leads a run under node id "a", prints "leading"


def start_node(path: Path) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, str(NODE), str(path), "0"], stdout=subprocess.PIPE, text=True,
                             env=os.environ | {"PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert child.stdout.readline().strip() == "leading"
    return child


def session(path: Path, node_id: str = "a", **options) -> sl.Session:
    options = {"lease_seconds": 60.0, "poll_seconds": 0.01} | options
    return sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=1), mailbox=sl.DirMailbox(path),
                      node_id=node_id, **options)  # fmt: skip


def test_a_second_live_process_under_the_same_node_id_is_refused_naming_the_id_and_the_fix(tmp_path):
    child = start_node(tmp_path / "run")
    try:
        started = time.monotonic()
        with pytest.raises(sl.ConfigError, match=r"node_id='a' is live in another process.*own node_id"):
            with session(tmp_path / "run"):
                pass
        # Fails fast: it sees the live lease rise within a beat (5 s at most), and waits a beat and a half.
        assert time.monotonic() - started < 1.5 * beat_seconds(120.0) + 1.0
        assert child.poll() is None  # the live one goes on
    finally:
        child.kill()
        child.wait()


def test_a_node_restarted_after_a_crash_rejoins_under_its_id(tmp_path):
    child = start_node(tmp_path / "run")
    child.kill()  # SIGKILL: its lease stays, and stops changing
    child.wait()
    assert sl.DirMailbox(tmp_path / "run").get(keys.node("a")) is not None
    with session(tmp_path / "run") as restarted:
        assert restarted.stats.versions[0] >= 1  # it joined the run, from its newest commit


def test_the_leader_sweeps_leases_left_by_crashed_nodes(tmp_path):
    mailbox, events = sl.DirMailbox(tmp_path / "run"), []
    with session(tmp_path / "run", lease_seconds=1.0, on_event=events.append):
        ghost = {"node": "ghost", "beat": 7, "step": 3, "samples": 12, "step_seconds": 0.1, "life": "x"}
        mailbox.put(keys.node("ghost"), records.encode(ghost))  # a lease that will never be renewed
        deadline = time.monotonic() + 10
        while mailbox.get(keys.node("ghost")) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mailbox.get(keys.node("ghost")) is None
        assert mailbox.get(keys.node("a")) is not None  # its own, live lease stays
    assert any(e.kind == "leases_swept" and e.data["keys"] == [keys.node("ghost")] for e in events)


def test_a_restart_on_the_same_machine_does_not_wait_for_the_crashed_lease_to_stand_still(tmp_path):
    child = start_node(tmp_path / "run")
    child.kill()
    child.wait()
    naps = []
    # Its lease names this machine and a process that is gone: no need to watch it for a beat and a half.
    refuse_if_live(sl.DirMailbox(tmp_path / "run"), "a", 60.0, sleep=naps.append)
    assert naps == []
    # A lease written elsewhere (another host) is watched: it stays still, so this node may take the id.
    mailbox, now = sl.MemoryMailbox(), [0.0]
    lease = {"node": "b", "beat": 3, "step": 0, "samples": 0, "step_seconds": 0.0, "life": "x", "host": "elsewhere",
             "pid": os.getpid()}  # fmt: skip
    mailbox.put(keys.node("b"), records.encode(lease))

    def nap(seconds: float) -> None:
        naps.append(seconds)
        now[0] += seconds

    refuse_if_live(mailbox, "b", 60.0, clock=lambda: now[0], sleep=nap)
    assert sum(naps) >= 1.5 * beat_seconds(60.0)


def test_a_failed_look_at_a_still_lease_is_skipped_not_a_failed_join():
    # The chaos run's seed 2 (dir) lost a node this way: an attempt to join wrote its lease and failed after,
    # so every later attempt watched that lease for a beat and a half (a dozen GETs at a 3 s lease), and with
    # 10% of requests failing, each attempt failed on one of them: 20 attempts in a row.
    inner, now, naps = sl.MemoryMailbox(), [0.0], []
    lease = {"node": "c", "beat": 3, "step": 0, "samples": 0, "step_seconds": 0.0, "life": "x", "host": "elsewhere",
             "pid": os.getpid()}  # fmt: skip
    inner.put(keys.node("c"), records.encode(lease))
    flaky = Faulty(inner, error_rate=0.5, seed=3, verbs=("get",), sleep=lambda _: None)

    def nap(seconds: float) -> None:
        naps.append(seconds)
        now[0] += seconds

    first = 0
    while True:  # the first look may fail: the caller tries again (this loop stands in for it)
        first += 1
        try:
            refuse_if_live(flaky, "c", 60.0, clock=lambda: now[0], sleep=nap)
            break
        except sl.MailboxError:
            assert not naps  # only the first look raises
    assert flaky.faults["error"] >= 3  # looks during the watch failed, and the watch went on
    assert sum(naps) >= 1.5 * beat_seconds(60.0)
