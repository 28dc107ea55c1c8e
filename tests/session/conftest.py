"""The S3 server fixture for the session tests (it lives in tests/s3server.py, shared with tests/mailbox)."""

import sys
from pathlib import Path

# The repository root, so that `tests.s3server` imports however pytest was started.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.s3server import s3_endpoint  # noqa: E402, F401
