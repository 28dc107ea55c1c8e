"""The Session's checks of what a user passes: options, step counts, and the default node name. Kept beside
the mailbox protocol (whose key rules name a node) so that session.py stays the driver's composition.
"""

import operator
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
        if (getattr(wire, name) or "F32") not in ENCODINGS:
            raise ConfigError(f"{name}={getattr(wire, name)!r} is not available in this build")


def count_of(samples: object) -> int:
    """`samples` as a non-negative int: an int, or anything operator.index takes (np.int64, a one-element
    integer tensor); a bool (or bool tensor) is refused, it is a flag, not a count."""
    is_flag = isinstance(samples, bool) or str(getattr(samples, "dtype", "")) in ("bool", "torch.bool")
    try:
        count = None if is_flag else operator.index(samples)
    except TypeError:
        count = None
    if count is None or count < 0:
        raise ConfigError(
            f"session.step(samples={samples!r}): samples must be a non-negative integer (an int, a numpy "
            "integer or a one-element integer tensor): the sequences or tokens that step trained on"
        )
    return count


def default_node_id() -> str:
    host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-")[:40] or "node"
    return f"{host}-{os.getpid()}"
