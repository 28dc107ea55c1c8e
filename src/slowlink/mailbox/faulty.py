"""A mailbox wrapper that injects seeded faults, for tests of everything above the storage contract.

It fails requests (before the inner mailbox saw them, or after a write was applied and its answer lost, as
real stores do), delays them, makes them time out, and cuts GET answers short. Each injected fault is
counted in `faults`; which request gets which fault depends only on the seed, the verb, the key and how
many times that verb has been asked of that key, so a run is repeatable whatever the thread interleaving.
`on_ignored` is the inner mailbox's: reading or setting it here reads or sets it there.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, MailboxUnavailable
from .contract import Listing, Mailbox, Object, check_key
from .ignored import Wrapper

VERBS = ("put", "get", "list", "delete")
WRITES = ("put", "delete")
FAULT_KINDS = ("error", "error_after_write", "timeout", "timeout_after_write", "partial")


class Faulty(Wrapper):
    """Wraps `inner`; every verb but `clock` may fail as configured.

    error_rate: share of requests that raise MailboxUnavailable at once.
    timeout_rate: share of requests that hang `timeout` seconds, then raise MailboxUnavailable.
    after_write_share: share of failed writes (put, delete) that fail after the inner write was applied.
    partial_rate: share of GET answers with data that come back cut to a shorter length.
    latency, jitter: every request first waits latency + uniform(0, jitter) seconds.
    verbs: which methods are subject to faults and latency.
    `faults` counts injected faults by kind (FAULT_KINDS); `requests` counts requests per verb ("PUT",
    "GET", "LIST", "DELETE"), as Metered and S3Mailbox do.
    """

    def __init__(
        self,
        inner: Mailbox,
        *,
        error_rate: float = 0.0,
        latency: float = 0.0,
        seed: int = 0,
        timeout_rate: float = 0.0,
        partial_rate: float = 0.0,
        after_write_share: float = 0.5,
        timeout: float = 0.0,
        jitter: float = 0.0,
        verbs: tuple[str, ...] = VERBS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        shares = dict(
            error_rate=error_rate,
            timeout_rate=timeout_rate,
            partial_rate=partial_rate,
            after_write_share=after_write_share,
        )
        for name, value in shares.items():
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"Faulty({name}={value}) must be a share between 0 and 1")
        if error_rate + timeout_rate > 1.0:
            raise ConfigError(
                f"Faulty(error_rate={error_rate}, timeout_rate={timeout_rate}) add up to more than 1; "
                "a request fails in one way at most"
            )
        for name, value in dict(latency=latency, jitter=jitter, timeout=timeout).items():
            if value < 0:
                raise ConfigError(f"Faulty({name}={value}) must be >= 0 seconds")
        unknown = set(verbs) - set(VERBS)
        if unknown:
            raise ConfigError(f"Faulty(verbs=...) names {sorted(unknown)}; choose among {VERBS}")
        self.inner = inner
        self.error_rate, self.timeout_rate, self.partial_rate = error_rate, timeout_rate, partial_rate
        self.after_write_share, self.timeout = after_write_share, timeout
        self.latency, self.jitter, self.seed = latency, jitter, seed
        self.verbs = frozenset(verbs)
        self.faults: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()
        self._sleep = sleep
        self._asked: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def _draws(self, verb: str, identity: str) -> tuple[float, float, float, random.Random]:
        with self._lock:
            self.requests[verb.upper()] += 1
            occurrence = self._asked[verb, identity]
            self._asked[verb, identity] += 1
        # Seeding from a string hashes it with SHA-512: the same on every run and every machine.
        rng = random.Random(f"{self.seed}:{verb}:{identity}:{occurrence}")
        return rng.random(), rng.random(), rng.random(), rng

    def _fail(self, kind: str, verb: str, identity: str) -> MailboxUnavailable:
        with self._lock:
            self.faults[kind] += 1
        if kind.startswith("timeout"):
            self._sleep(self.timeout)
        after = kind.endswith("after_write")
        when = "after the store applied it; its answer was lost" if after else "before reaching the store"
        label = "timeout" if kind.startswith("timeout") else "failure"
        return MailboxUnavailable(
            f"injected {label} (Faulty, seed {self.seed}): {verb.upper()} {identity} failed {when}"
        )

    def _call(self, verb: str, identity: str, action: Callable[[], Any]) -> Any:
        if verb not in self.verbs:
            return action()
        which, when, delay, rng = self._draws(verb, identity)
        if self.latency or self.jitter:
            self._sleep(self.latency + delay * self.jitter)
        kind = None
        if which < self.error_rate:
            kind = "error"
        elif which < self.error_rate + self.timeout_rate:
            kind = "timeout"
        if kind is not None and verb in WRITES and when < self.after_write_share:
            action()
            raise self._fail(kind + "_after_write", verb, identity)
        if kind is not None:
            raise self._fail(kind, verb, identity)
        answer = action()
        if verb == "get" and answer is not None and answer.data and rng.random() < self.partial_rate:
            with self._lock:
                self.faults["partial"] += 1
            answer = Object(answer.data[: rng.randrange(len(answer.data))], answer.etag)
        return answer

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        check_key(key)
        return self._call(
            "put", key, lambda: self.inner.put(key, data, if_absent=if_absent, if_match=if_match)
        )

    def get(
        self, key: str, *, if_none_match: str | None = None, max_bytes: int | None = None
    ) -> Object | None:
        check_key(key)
        return self._call(
            "get", key, lambda: self.inner.get(key, if_none_match=if_none_match, max_bytes=max_bytes)
        )

    def list(self, prefix: str, *, start_after: str | None = None) -> list[Listing]:
        return self._call(
            "list", f"{prefix}>{start_after or ''}", lambda: self.inner.list(prefix, start_after=start_after)
        )

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            check_key(key)
        self._call("delete", ",".join(keys), lambda: self.inner.delete(keys))

    def __repr__(self) -> str:
        return f"Faulty({self.inner!r}, seed={self.seed}, faults={dict(self.faults)})"
