"""A mailbox wrapper that counts requests by verb (and by verb and kind of key: "GET head.json",
"PUT rounds/") and bytes each way, for stats and benchmarks.

`on_ignored` is the inner mailbox's: reading or setting it here reads or sets it there.
"""

from __future__ import annotations

import threading
from collections import Counter

from .contract import Listing, Mailbox, Object
from .ignored import Wrapper


class Metered(Wrapper):
    def __init__(self, inner: Mailbox) -> None:
        self.inner = inner
        self.requests: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()  # "VERB kind": the kind is a key's first folder, or its name
        self.bytes_sent = 0
        self.bytes_received = 0
        self._lock = threading.Lock()

    def _count(self, verb: str, key: str, sent: int = 0, received: int = 0) -> None:
        folder, slash, _ = key.partition("/")
        with self._lock:
            self.requests[verb] += 1
            self.kinds[f"{verb} {folder}{slash}"] += 1
            self.bytes_sent += sent
            self.bytes_received += received

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        self._count("PUT", key, sent=len(data))
        return self.inner.put(key, data, if_absent=if_absent, if_match=if_match)

    def get(
        self, key: str, *, if_none_match: str | None = None, max_bytes: int | None = None
    ) -> Object | None:
        found = self.inner.get(key, if_none_match=if_none_match, max_bytes=max_bytes)
        self._count(
            "GET", key, received=len(found.data) if found is not None and found.data is not None else 0
        )
        return found

    def list(self, prefix: str, *, start_after: str | None = None) -> list[Listing]:
        self._count("LIST", prefix)
        return self.inner.list(prefix, start_after=start_after)

    def delete(self, keys: list[str]) -> None:
        if keys:
            self._count("DELETE", keys[0])
            self.inner.delete(keys)

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())
