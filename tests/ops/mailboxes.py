"""Mailbox wrappers for the operating tests: one that keeps summary.json as the merger will once it
calls protocol.summary.record_commit, and one that records every request a reader makes."""

from __future__ import annotations

import json
import threading
from collections import Counter

from slowlink.protocol.summary import record_commit


class Summarizing:
    """Passes everything through; after a commit record lands, folds it into summary.json, exactly as the
    merger's hook does (record_commit is idempotent, so this stays right once the merger calls it too)."""

    def __init__(self, inner, fragments: int) -> None:
        self.inner, self.fragments = inner, fragments
        self.failures: list[BaseException] = []

    def put(self, key, data, *, if_absent=False, if_match=None):
        etag = self.inner.put(key, data, if_absent=if_absent, if_match=if_match)
        if key.startswith("commits/"):
            try:
                record_commit(self.inner, self.fragments, json.loads(data))
            except BaseException as error:  # surfaced by the test, never by the merger
                self.failures.append(error)
        return etag

    def get(self, key, *, if_none_match=None, max_bytes=None):
        return self.inner.get(key, if_none_match=if_none_match, max_bytes=max_bytes)

    def list(self, prefix, *, start_after=None):
        return self.inner.list(prefix, start_after=start_after)

    def delete(self, keys):
        self.inner.delete(keys)

    def clock(self):
        return self.inner.clock()

    def __reduce__(self):  # a copy for another process summarizes too
        return Summarizing, (self.inner, self.fragments)


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
