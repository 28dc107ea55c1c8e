"""Fixtures for the session tests: the S3 server (it lives in tests/s3server.py, shared with tests/mailbox),
and `store`, a fresh run's mailbox over a directory and over that server."""

import itertools
import sys
import time
from pathlib import Path

import pytest

# The repository root, so that `tests.s3server` imports however pytest was started.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import slowlink as sl  # noqa: E402
from tests.s3server import s3_endpoint  # noqa: E402, F401

_prefixes = itertools.count()


@pytest.fixture(params=["dir", "s3"])
def store(request, tmp_path):
    """A fresh mailbox of each kind; the S3 one under a new prefix of the test bucket."""
    if request.param == "dir":
        return sl.DirMailbox(tmp_path / "run")
    endpoint = request.getfixturevalue("s3_endpoint")
    return sl.S3Mailbox(endpoint.bucket, f"run-{next(_prefixes)}-{time.time_ns()}",
                        endpoint_url=endpoint.url, region=endpoint.region)  # fmt: skip
