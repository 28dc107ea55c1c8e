"""Size caps on reads: an object over its reader's limit is refused before its bytes are read.

Every `get` takes `max_bytes`. A mailbox compares it with the object's stated size before reading, then
reads through `read_capped`, which stops one byte past the limit, so a size that lies cannot make it read
more. Which limit each record and payload gets is the protocol's business (protocol/).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConfigError, ObjectTooLarge

# The cap when a caller states none. Every read slowlink makes names its own limit (4 MiB for a record,
# about twice a fragment's float32 bytes for a payload); this one is only a backstop, so that an object
# nobody sized (a 3 GiB sparse file, a hostile bucket's object) fails with ObjectTooLarge, not a
# MemoryError or a swapping node. 1 GiB is well past any record and any fragment of under ~128M
# parameters, and small enough to hold in memory on the machines slowlink runs on.
DEFAULT_MAX_BYTES = 1 << 30
_CHUNK = 1 << 16  # read size past an object's stated length: only ever meets a liar or the end


def resolve_limit(max_bytes: int | None) -> int:
    """The limit a `get(max_bytes=...)` means: the caller's, or DEFAULT_MAX_BYTES for None."""
    if max_bytes is None:
        return DEFAULT_MAX_BYTES
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ConfigError(
            f"get(max_bytes={max_bytes!r}) must be a whole number of bytes >= 0, or None for the default "
            f"cap of {DEFAULT_MAX_BYTES} bytes"
        )
    return max_bytes


def read_capped(read: Callable[[int], bytes], *, expected: int, limit: int, key: str, where: str) -> bytes:
    """Everything `read(n)` yields until it returns b"", never asking for more than `limit` + 1 bytes in
    all: the first byte past the limit raises ObjectTooLarge, whatever `expected` (the stated size) said.

    The first read asks for the stated size plus one, so an honest object takes one read and one more
    that finds its end; no read ever asks for more than is still allowed, so nothing larger is allocated.
    """
    parts: list[bytes] = []
    total = 0
    while True:
        left = expected - total
        chunk = read(min(left + 1 if left > 0 else _CHUNK, limit + 1 - total))
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        total += len(chunk)
        if total > limit:
            raise ObjectTooLarge(key, None, limit, where)
