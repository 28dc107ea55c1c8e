"""A mailbox wrapper for the operating tests: it records every request a reader makes."""

from __future__ import annotations

import threading
from collections import Counter


class Recording:
    """Counts requests by verb, and remembers any write: a reader must make none."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.requests: Counter[str] = Counter()
        self.writes: list[str] = []
        self._lock = threading.Lock()

    def _count(self, verb):
        with self._lock:
            self.requests[verb] += 1

    def put(self, key, data, *, if_absent=False, if_match=None):
        self.writes.append(f"PUT {key}")
        raise AssertionError(f"a reader wrote {key}")

    def delete(self, keys):
        self.writes.append(f"DELETE {keys}")
        raise AssertionError(f"a reader deleted {keys}")

    def get(self, key, *, if_none_match=None, max_bytes=None):
        self._count("GET")
        return self.inner.get(key, if_none_match=if_none_match, max_bytes=max_bytes)

    def list(self, prefix, *, start_after=None):
        self._count("LIST")
        return self.inner.list(prefix, start_after=start_after)

    def clock(self):
        return self.inner.clock()

    @property
    def total(self) -> int:
        return sum(self.requests.values())
