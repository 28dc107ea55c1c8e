"""Fixtures for the operating tests: the S3 server (tests/s3server.py) and the session helpers."""

import sys
from pathlib import Path

# The repository root, so that `tests.s3server` imports however pytest was started.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.s3server import s3_endpoint  # noqa: E402, F401
