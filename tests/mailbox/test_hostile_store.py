"""A directory that is not the plain folder slowlink wrote: links, FIFOs, sockets, huge files, odd names, locks.

Whoever can write to the store must never make a node reach outside the mailbox, hang, or run out of memory.
Every case is made for real in a real directory. The same for S3: test_hostile_s3.py; a full disk:
test_full_disk.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import pickle
import shutil
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import slowlink
from slowlink.errors import ConfigError, MailboxRejected, MailboxUnavailable, ObjectTooLarge, PayloadError
from slowlink.mailbox import DirMailbox, MemoryMailbox, Object, directory
from slowlink.mailbox.faulty import Faulty
from slowlink.mailbox.metered import Metered
from tests.mailbox.recording_hook import Hook

SOURCE = str(Path(slowlink.__file__).resolve().parents[1])  # what a child process puts on its path
TEMPORARIES = (".slowlink", "tmp")


def directory_mailbox(tmp_path: Path) -> tuple[DirMailbox, Hook]:
    mailbox = DirMailbox(tmp_path / "mailbox")
    hook = Hook()
    mailbox.on_ignored = hook
    return mailbox, hook


def outside_tree(tmp_path: Path) -> Path:
    """A directory beside the mailbox holding a file someone would miss: what a link must never reach."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA user@host\n")
    return home


def temporaries(mailbox: DirMailbox) -> list[str]:
    scratch = mailbox.path.joinpath(*TEMPORARIES)
    return sorted(os.listdir(scratch)) if scratch.exists() else []


# -- links -----------------------------------------------------------------------------------------


def test_a_round_folder_replaced_by_a_link_is_neither_listed_nor_cleaned_through(tmp_path):
    mailbox, hook = directory_mailbox(tmp_path)
    home = outside_tree(tmp_path)
    mailbox.put("rounds/0000/0000000001/a.json", b"{}")
    (mailbox.path / "rounds" / "0000" / "0000000002").symlink_to(home, target_is_directory=True)

    listed = [item.key for item in mailbox.list("rounds/")]
    assert listed == ["rounds/0000/0000000001/a.json"]
    assert hook.keys == ["rounds/0000/0000000002"] and "link" in hook.calls[0][1]
    # The leader's clean-up deletes what it listed, and may name keys the link would reach.
    mailbox.delete(listed + ["rounds/0000/0000000002/.ssh/authorized_keys"])
    assert mailbox.get("rounds/0000/0000000002/.ssh/authorized_keys") is None
    assert (home / ".ssh" / "authorized_keys").read_text() == "ssh-ed25519 AAAA user@host\n"
    assert mailbox.list("rounds/") == []


def test_a_linked_nodes_folder_is_never_written_through_and_the_refused_put_leaves_no_file(tmp_path):
    mailbox, hook = directory_mailbox(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "b.json").write_bytes(b"not the run's")
    mailbox.put("run.json", b"{}")
    (mailbox.path / "nodes").symlink_to(elsewhere, target_is_directory=True)

    with pytest.raises(MailboxRejected, match=r"nodes.* symbolic link.*(remove|replace)"):
        mailbox.put("nodes/a.json", b"beat 1")
    assert sorted(os.listdir(elsewhere)) == ["b.json"]
    assert temporaries(mailbox) == []
    assert mailbox.get("nodes/b.json") is None  # nor read through
    assert mailbox.list("nodes/") == [] and mailbox.list("") == [mailbox.list("run.json")[0]]
    assert "nodes" in hook.keys


def test_a_linked_scratch_folder_is_never_written_through(tmp_path):
    mailbox, _ = directory_mailbox(tmp_path)
    mailbox.put("run.json", b"{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(mailbox.path / ".slowlink")
    (mailbox.path / ".slowlink").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(MailboxRejected, match=r"\.slowlink.* symbolic link"):
        mailbox.put("head.json", b"{}")
    assert os.listdir(elsewhere) == []


def test_a_key_that_is_a_link_to_a_file_reads_as_absent_and_writes_replace_the_link_only(tmp_path):
    mailbox, hook = directory_mailbox(tmp_path)
    home = outside_tree(tmp_path)
    secret = home / ".ssh" / "authorized_keys"
    mailbox.put("run.json", b"{}")
    (mailbox.path / "head.json").symlink_to(secret)

    assert mailbox.get("head.json") is None
    assert [item.key for item in mailbox.list("")] == ["run.json"]
    assert hook.keys == ["head.json"]  # once, though met twice
    with pytest.raises(slowlink.MailboxError):  # a link matches no etag
        mailbox.put("head.json", b"{}", if_match="0-0-0")
    etag = mailbox.put("head.json", b'{"versions": [1]}', if_absent=True)  # a link is not an object
    assert mailbox.get("head.json") == Object(b'{"versions": [1]}', etag)
    assert secret.read_text() == "ssh-ed25519 AAAA user@host\n"
    assert not (mailbox.path / "head.json").is_symlink()


def test_deleting_a_key_that_is_a_link_removes_the_link_and_never_its_target(tmp_path):
    mailbox, _ = directory_mailbox(tmp_path)
    home = outside_tree(tmp_path)
    mailbox.put("blobs/keep", b"x")
    (mailbox.path / "blobs" / "ab12").symlink_to(home / ".ssh" / "authorized_keys")
    mailbox.delete(["blobs/ab12"])
    assert not os.path.lexists(mailbox.path / "blobs" / "ab12")
    assert (home / ".ssh" / "authorized_keys").exists()
    assert mailbox.get("blobs/keep").data == b"x"


def lock_file(mailbox: DirMailbox, key: str) -> Path:
    lock = mailbox.path / ".slowlink" / "locks" / hashlib.sha1(key.encode()).hexdigest()
    lock.parent.mkdir(parents=True, exist_ok=True)
    return lock


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_lock_file_that_is_not_a_regular_file_is_refused_and_nothing_is_made_through_it(tmp_path, kind):
    mailbox, _ = directory_mailbox(tmp_path)
    etag = mailbox.put("head.json", b"v1")
    lock, outside = lock_file(mailbox, "head.json"), tmp_path / "outside-lock"
    if kind == "link":
        lock.symlink_to(outside)
    else:
        os.mkfifo(lock)
    with pytest.raises(MailboxRejected, match=r"lock file .* is a (symbolic link|FIFO); remove"):
        mailbox.put("head.json", b"v2", if_match=etag)
    assert not outside.exists() and temporaries(mailbox) == []
    assert mailbox.get("head.json").data == b"v1"


def test_a_lock_held_outside_the_run_fails_a_compare_and_swap_at_its_deadline_not_never(
    tmp_path, monkeypatch
):
    mailbox, _ = directory_mailbox(tmp_path)
    etag = mailbox.put("head.json", b"v1")
    monkeypatch.setattr(directory, "LOCK_SECONDS", 0.05)
    with open(lock_file(mailbox, "head.json"), "a+b") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(MailboxUnavailable, match=r"head.json .* lock file .* was held for 0.05 s"):
            mailbox.put("head.json", b"v2", if_match=etag)
    assert mailbox.get("head.json").data == b"v1" and temporaries(mailbox) == []
    mailbox.put("head.json", b"v2", if_match=etag)  # let go of: the swap goes through
    assert mailbox.get("head.json").data == b"v2"


# -- special files and sizes -----------------------------------------------------------------------


def test_a_fifo_in_place_of_head_json_reads_as_absent_at_once(tmp_path):
    mailbox, hook = directory_mailbox(tmp_path)
    mailbox.put("run.json", b"{}")
    fifo = mailbox.path / "head.json"
    os.mkfifo(fifo)
    answers: list[object] = []
    reader = threading.Thread(target=lambda: answers.append(mailbox.get("head.json")), daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # opened the FIFO and waits for a writer: give it one, so the test can end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
        pytest.fail("get() of a FIFO blocked until someone opened it for writing")
    assert answers == [None]
    assert hook.keys == ["head.json"] and "FIFO" in hook.calls[0][1]
    assert [item.key for item in mailbox.list("")] == ["run.json"]


_HUGE_FILE_CHILD = """
import os, resource, sys, time
from slowlink.errors import ObjectTooLarge
from slowlink.mailbox import DirMailbox
mailbox = DirMailbox(sys.argv[1])
# Allow this process 256 MiB more address space than it holds now: reading the file would need 3 GiB.
pages = int(open("/proc/self/statm").read().split()[0])
limit = pages * os.sysconf("SC_PAGE_SIZE") + (256 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
for max_bytes in (None, 4 << 20):
    try:
        mailbox.get("run.json", max_bytes=max_bytes)
        print("read it")
    except ObjectTooLarge as error:
        print("refused", error.key, error.size, error.limit)
    except MemoryError:
        print("MemoryError")
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads its memory use from /proc")
def test_a_huge_sparse_run_json_is_refused_by_its_size_before_memory_is_taken(tmp_path):
    mailbox, _ = directory_mailbox(tmp_path)
    mailbox.put("head.json", b"{}")
    with open(mailbox.path / "run.json", "wb") as huge:
        huge.truncate(3 << 30)  # sparse: 3 GiB long, no disk used
    child = subprocess.run(
        [sys.executable, "-c", _HUGE_FILE_CHILD, str(mailbox.path)],
        env={**os.environ, "PYTHONPATH": SOURCE},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    from slowlink.mailbox.limits import DEFAULT_MAX_BYTES

    assert child.stdout.split("\n")[:2] == [
        f"refused run.json {3 << 30} {DEFAULT_MAX_BYTES}",
        f"refused run.json {3 << 30} {4 << 20}",
    ]


def test_an_object_over_the_limit_is_refused_with_its_key_size_and_limit_named(tmp_path):
    mailbox, _ = directory_mailbox(tmp_path)
    mailbox.put("blobs/big", os.urandom(10_000))
    with pytest.raises(ObjectTooLarge, match=r"blobs/big .*10000 bytes.*9999-byte limit") as raised:
        mailbox.get("blobs/big", max_bytes=9_999)
    assert isinstance(raised.value, PayloadError)
    assert (raised.value.key, raised.value.size, raised.value.limit) == ("blobs/big", 10_000, 9_999)


def test_odd_names_and_special_files_are_ignored_and_each_reported_once(tmp_path, caplog, monkeypatch):
    mailbox = DirMailbox(tmp_path / "mailbox")
    mailbox.put("rounds/0000/0000000001/a.json", b"{}")
    folder = mailbox.path / "rounds" / "0000" / "0000000001"
    odd = [
        "a b",
        "é.json",
        "new\nline",
        "x.json\n",
        "back\\slash",
        "semi;colon",
        "~",
        os.fsdecode(b"\xff.json"),
    ]
    for name in odd:
        (folder / name).write_bytes(b"{}")
    (folder / "x y").mkdir()
    (folder / "x y" / "c.json").write_bytes(b"{}")
    os.mkfifo(folder / "f.json")
    monkeypatch.chdir(folder)  # a socket's path must be short: bind it relative to its folder
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind("s.json")
    with caplog.at_level(logging.WARNING, logger="slowlink"):
        for _ in range(2):
            assert [item.key for item in mailbox.list("rounds/")] == ["rounds/0000/0000000001/a.json"]
    expected = {f"rounds/0000/0000000001/{name}" for name in [*odd, "x y", "f.json", "s.json"]}
    warned = [record.getMessage() for record in caplog.records if record.name == "slowlink"]
    assert len(warned) == len(expected)  # once per key, though listed twice
    assert all(any(repr(key) in message for message in warned) for key in expected)


def test_the_hook_is_called_once_per_key_and_may_be_replaced(tmp_path):
    mailbox, hook = directory_mailbox(tmp_path)
    mailbox.put("blobs/ok", b"x")
    os.mkfifo(mailbox.path / "blobs" / "fifo")
    for _ in range(3):
        mailbox.list("blobs/")
        mailbox.get("blobs/fifo")
    assert hook.keys == ["blobs/fifo"]


def test_a_key_refused_by_its_name_deletes_nothing_and_writes_nothing(tmp_path):
    mailbox, _ = directory_mailbox(tmp_path)
    mailbox.put("keep", b"x")
    with pytest.raises(ConfigError):
        mailbox.delete(["keep", "../keep"])
    with pytest.raises(ConfigError):
        mailbox.put("../escape", b"x")
    assert mailbox.get("keep").data == b"x"
    assert not (tmp_path / "escape").exists() and temporaries(mailbox) == []


def test_a_prefix_that_climbs_out_of_the_mailbox_lists_nothing(tmp_path):
    mailbox, _ = directory_mailbox(tmp_path)
    outside_tree(tmp_path)
    mailbox.put("run.json", b"{}")
    assert mailbox.list("../") == [] and mailbox.list("../home/") == []


# -- wrappers forward the hook ---------------------------------------------------------------------


@pytest.mark.parametrize("wrap", [Faulty, Metered], ids=["faulty", "metered"])
def test_a_hook_set_on_a_wrapper_reaches_the_mailbox_inside(tmp_path, wrap):
    inner = DirMailbox(tmp_path / "mailbox")
    wrapper = wrap(inner)
    hook = Hook()
    wrapper.on_ignored = hook
    assert inner.on_ignored is hook and wrapper.on_ignored is hook
    inner.put("blobs/ok", b"x")
    os.mkfifo(inner.path / "blobs" / "fifo")
    assert [item.key for item in wrapper.list("blobs/")] == ["blobs/ok"]
    assert hook.keys == ["blobs/fifo"]
    with pytest.raises(ObjectTooLarge):
        wrapper.get("blobs/ok", max_bytes=0)


def test_every_mailbox_has_a_default_hook_that_warns_on_the_slowlink_logger(tmp_path, caplog):
    for mailbox in (MemoryMailbox(), DirMailbox(tmp_path)):
        with caplog.at_level(logging.WARNING, logger="slowlink"):
            mailbox.on_ignored("some key", "a reason")
        assert "'some key'" in caplog.records[-1].getMessage()
        assert caplog.records[-1].name == "slowlink"


def test_object_too_large_crosses_a_process_boundary_with_its_fields():
    error = pickle.loads(pickle.dumps(ObjectTooLarge("blobs/b", None, 10, "s3://bucket/run")))
    assert (error.key, error.size, error.limit) == ("blobs/b", None, 10)
    assert "blobs/b in s3://bucket/run is more than 10 bytes" in str(error)


def test_a_regular_file_in_the_directory_is_what_a_key_reads(tmp_path):
    # The plain case still works after all the refusals: a file written by hand is an object.
    mailbox, hook = directory_mailbox(tmp_path)
    (mailbox.path / "blobs").mkdir(parents=True)
    (mailbox.path / "blobs" / "by-hand").write_bytes(b"hello")
    found = mailbox.get("blobs/by-hand")
    assert found.data == b"hello" and stat.S_ISREG(os.stat(mailbox.path / "blobs" / "by-hand").st_mode)
    assert [item.key for item in mailbox.list("blobs/")] == ["blobs/by-hand"] and hook.calls == []
