"""A mailbox in one process's memory: for tests, notebooks and several sessions in one process."""

from __future__ import annotations

import hashlib
import itertools
import threading
import time

from ..errors import ObjectTooLarge, PreconditionFailed
from .contract import Listing, Object, check_key
from .ignored import IgnoredHook, warn_ignored
from .limits import resolve_limit


class MemoryMailbox:
    """A dict behind a lock. Etags change on every write, even of the same bytes, as a version would.

    Only `put` adds keys, and it checks them, so `on_ignored` is never called; it is here because every
    mailbox has it.
    """

    def __init__(self) -> None:
        self.on_ignored: IgnoredHook = warn_ignored
        self._objects: dict[str, tuple[bytes, str]] = {}
        self._lock = threading.Lock()
        self._versions = itertools.count(1)

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        check_key(key)
        data = bytes(data)
        with self._lock:
            current = self._objects.get(key)
            if if_absent and current is not None:
                raise PreconditionFailed(f"{key} already exists")
            if if_match is not None and (current is None or current[1] != if_match):
                raise PreconditionFailed(f"{key} changed since etag {if_match}")
            etag = f"{next(self._versions):x}-{hashlib.md5(data).hexdigest()[:12]}"
            self._objects[key] = (data, etag)
            return etag

    def get(
        self, key: str, *, if_none_match: str | None = None, max_bytes: int | None = None
    ) -> Object | None:
        check_key(key)
        limit = resolve_limit(max_bytes)
        with self._lock:
            current = self._objects.get(key)
        if current is None:
            return None
        data, etag = current
        if etag == if_none_match:
            return Object(None, etag)
        if len(data) > limit:
            raise ObjectTooLarge(key, len(data), limit, "a MemoryMailbox")
        return Object(data, etag)

    def list(self, prefix: str, *, start_after: str | None = None) -> list[Listing]:
        with self._lock:
            items = [(k, v) for k, v in self._objects.items() if k.startswith(prefix)]
        return [
            Listing(k, etag, len(data))
            for k, (data, etag) in sorted(items, key=lambda item: item[0].encode())
            if start_after is None or k.encode() > start_after.encode()
        ]

    def delete(self, keys: list[str]) -> None:
        for key in keys:  # all checked first, so a bad key deletes nothing
            check_key(key)
        with self._lock:
            for key in keys:
                self._objects.pop(key, None)

    def clock(self) -> float:
        return time.time()

    def __repr__(self) -> str:
        return f"MemoryMailbox({len(self._objects)} objects)"
