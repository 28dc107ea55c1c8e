"""The storage contract: five verbs every mailbox implements, and nothing more.

`put` (create-once with `if_absent`, compare-and-swap with `if_match`), `get` (conditional with
`if_none_match`, capped by `max_bytes`), `list` (byte order), `delete`, and `clock`. The protocol layer
is written against this contract only; tests/mailbox/test_contract.py runs one suite against every
implementation. A store may hold what slowlink could not have written (a key that fails `check_key`, a
link or a FIFO in a directory): no verb ever uses it, and each implementation reports it once through its
`on_ignored(key, reason)` attribute (mailbox/ignored.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from ..errors import ConfigError

# Keys are relative paths of safe characters: the same key must be valid on S3 and on a file system.
KEY_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")


@dataclass(frozen=True)
class Object:
    """What `get` returns. `data` is None exactly when the object still has the etag `if_none_match` named."""

    data: bytes | None
    etag: str


@dataclass(frozen=True)
class Listing:
    """One key of a `list` answer; the etag lets a caller notice a change without a GET."""

    key: str
    etag: str
    size: int


class Mailbox(Protocol):
    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        """Store `data` under `key` and return its new etag.

        if_absent: fail with PreconditionFailed if the key exists (create-once; exactly one racer wins).
        if_match: fail with PreconditionFailed unless the key's current etag is this one (compare-and-swap).
        """
        ...

    def get(
        self, key: str, *, if_none_match: str | None = None, max_bytes: int | None = None
    ) -> Object | None:
        """The object under `key`, None if absent; `data` is None when its etag equals `if_none_match`.

        max_bytes: an object larger than this raises ObjectTooLarge before any of it is read; None means
        limits.DEFAULT_MAX_BYTES, never unbounded.
        """
        ...

    def list(self, prefix: str, *, start_after: str | None = None) -> list[Listing]:
        """Every key starting with `prefix` (and after `start_after`), in byte order."""
        ...

    def delete(self, keys: list[str]) -> None:
        """Remove these keys; absent keys are not an error."""
        ...

    def clock(self) -> float:
        """The store's time in seconds since the epoch, as well as this node can tell."""
        ...


def is_key(key: str) -> bool:
    """Whether slowlink could have written `key`: what a listing of a hostile store is filtered by."""
    return bool(KEY_PATTERN.fullmatch(key)) and not any(part in (".", "..") for part in key.split("/"))


def check_key(key: str) -> str:
    if not is_key(key):
        raise ConfigError(
            f"mailbox key {key!r} is not allowed: use '/'-separated parts of letters, digits, '.', '_' and '-'"
        )
    return key


def join_key(prefix: str, key: str) -> str:
    return f"{prefix.strip('/')}/{key}" if prefix.strip("/") else key
