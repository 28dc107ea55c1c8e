"""The Session's checks of what a user passes (its options; step counts are engine/samples.py's), and the
default node name. Kept beside
the mailbox protocol (whose key rules name a node) so that session.py stays the driver's composition.
"""

import os
import re
import socket

from ..algorithms.method import Method
from ..errors import ConfigError
from ..wire.encodings import ENCODINGS
from . import keys


def check_options(algorithm: object, node_id: str | None, compression: str | None, *seconds: float) -> None:
    if not isinstance(algorithm, Method):
        raise ConfigError(
            f"algorithm={algorithm!r} must be a slowlink method such as sl.DiLoCo(sync_every=100)"
        )
    if node_id is not None and not keys.NODE_ID.match(node_id):
        raise ConfigError(f"node_id={node_id!r} must be 1-64 of [a-z0-9_-], starting with a letter or digit")
    if compression not in (None, "zstd"):
        raise ConfigError(f"compression={compression!r} must be None or 'zstd'")
    for name, value in zip(("poll_seconds", "lease_seconds", "close_timeout"), seconds, strict=True):
        if not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"{name}={value!r} must be a positive number of seconds")
    wire = algorithm.wire()
    for name in ("delta_dtype", "commit_dtype"):
        if (value := getattr(wire, name) or "F32") not in ENCODINGS and not value.startswith("TOPK("):
            raise ConfigError(f"{name}={getattr(wire, name)!r} is not available in this build")


def default_node_id() -> str:
    host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-")[:40] or "node"
    return f"{host}-{os.getpid()}"
