"""Fixtures for the mailbox tests: one empty mailbox of each kind, and the S3 server the S3 one talks to.

The S3 server fixture lives in tests/s3server.py so that other test folders can import it the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The repository root, so that `tests.s3server` imports however pytest was started.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from slowlink.mailbox import DirMailbox, MemoryMailbox  # noqa: E402
from slowlink.mailbox.faulty import Faulty  # noqa: E402
from tests.s3server import fresh_s3_mailbox, s3_endpoint  # noqa: E402, F401

# "faulty" is Faulty around a MemoryMailbox with no faults: it must pass every argument through unchanged.
MAILBOX_KINDS = ["memory", "directory", "s3", "faulty"]


@pytest.fixture(params=MAILBOX_KINDS)
def mailbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    """An empty mailbox of each kind; the S3 one lives under a fresh prefix of the test bucket."""
    if request.param == "memory":
        yield MemoryMailbox()
    elif request.param == "faulty":
        yield Faulty(MemoryMailbox())
    elif request.param == "directory":
        yield DirMailbox(tmp_path / "mailbox")
    else:
        with fresh_s3_mailbox(request.getfixturevalue("s3_endpoint")) as s3:
            yield s3
