"""A DirMailbox on a disk that fills up: every failed write removes its temporary file and says why.

The disk is real: a tmpfs of a few hundred KiB (or of 40 inodes), mounted in a user namespace of a child
process, and a file size limit set with setrlimit in another. A test skips where neither can be made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import slowlink

SOURCE = str(Path(slowlink.__file__).resolve().parents[1])  # what a child process puts on its path

_FULL_DISK_CHILD = """
import json, os, sys
from slowlink.errors import MailboxRejected
from slowlink.mailbox import DirMailbox
mailbox = DirMailbox(os.path.join(sys.argv[1], "run"))
size = int(sys.argv[2])
messages, written = [], 0
for n in range(200):  # past full, as a node that goes on training does
    try:
        mailbox.put(f"rounds/0000/{n:010d}/node.json", os.urandom(size))
        written += 1
    except MailboxRejected as error:
        messages.append(str(error))
scratch = os.path.join(sys.argv[1], "run", ".slowlink", "tmp")
print(json.dumps({
    "written": written, "failed": len(messages), "first": messages[:1],
    "temporaries": os.listdir(scratch) if os.path.isdir(scratch) else [],
    "listed": len(mailbox.list("rounds/")),
}))
"""


def _in_a_small_tmpfs(tmp_path: Path, options: str, size: int) -> dict:
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs in a user namespace")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    script = 'mount -t tmpfs -o "$1" tmpfs "$2" || exit 77; exec "$3" -c "$4" "$2" "$5"'
    command = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh"]
    child = subprocess.run(
        [*command, options, str(mount_point), sys.executable, _FULL_DISK_CHILD, str(size)],
        env={**os.environ, "PYTHONPATH": SOURCE},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if child.returncode in (1, 77) and not child.stdout:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {child.stderr.strip()[:200]}")
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout)


@pytest.mark.parametrize(
    ("options", "size"),
    [("size=256k", 40_000), ("size=16m,nr_inodes=40", 100)],
    ids=["out of bytes", "out of inodes"],
)
def test_a_full_disk_leaves_no_temporary_file_and_says_the_disk_is_full(tmp_path, options, size):
    outcome = _in_a_small_tmpfs(tmp_path, options, size)
    assert outcome["written"] > 0 and outcome["failed"] > 0
    assert outcome["written"] + outcome["failed"] == 200
    assert outcome["temporaries"] == []
    assert outcome["listed"] == outcome["written"]  # nothing half-written is listed
    message = outcome["first"][0]
    assert "disk is full" in message and "/run" in message
    assert "free space" in message and "choose a path this process can create" not in message


_FILE_SIZE_LIMIT_CHILD = """
import os, resource, signal, sys
from slowlink.errors import MailboxRejected
from slowlink.mailbox import DirMailbox
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so that a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
mailbox = DirMailbox(sys.argv[1])
mailbox.put("small", b"x" * 100)
for _ in range(20):
    try:
        mailbox.put("blobs/big", b"x" * (1 << 17))
    except MailboxRejected as error:
        message = str(error)
print(message)
print(sorted(os.listdir(os.path.join(sys.argv[1], ".slowlink", "tmp"))))
print([listing.key for listing in mailbox.list("")])
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX resource limits")
def test_a_write_over_the_file_size_limit_leaves_no_temporary_file_and_says_why(tmp_path):
    child = subprocess.run(
        [sys.executable, "-c", _FILE_SIZE_LIMIT_CHILD, str(tmp_path / "run")],
        env={**os.environ, "PYTHONPATH": SOURCE},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    message, leftover, listed = child.stdout.strip().split("\n")
    assert "blobs/big" in message and "larger than" in message and str(tmp_path / "run") in message
    assert leftover == "[]" and listed == "['small']"
