"""Keys a store holds that slowlink could not have written: never used, and reported once each.

A directory can hold symbolic links, FIFOs, sockets, devices and names of odd characters; a bucket can
hold keys with spaces, '..' or a trailing '/'. A mailbox skips each one and calls its `on_ignored(key,
reason)` hook the first time it meets it. The default hook logs a warning on the "slowlink" logger; a
Session replaces it to turn each into an event. `Wrapper` passes the hook (and the clock) through the
mailboxes that wrap another (faulty.py, metered.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("slowlink")

IgnoredHook = Callable[[str, str], None]
# A hostile store can hold any number of odd names; remembering which were reported must stay bounded.
MAX_REPORTED = 10_000


def warn_ignored(key: str, reason: str) -> None:
    """The default `on_ignored` hook."""
    log.warning("the mailbox ignores %r: %s", key, reason)


class IgnoredKeys:
    """Which ignored keys a mailbox has reported, so that its hook hears of each one once.

    After MAX_REPORTED distinct keys, further ones are still ignored but no longer reported, and one
    warning says so.
    """

    def __init__(self) -> None:
        self._reported: set[str] = set()
        self._lock = threading.Lock()
        self._full = False

    def report(self, hook: IgnoredHook, key: str, reason: str) -> None:
        with self._lock:
            if key in self._reported:
                return
            if len(self._reported) >= MAX_REPORTED:
                if not self._full:
                    self._full = True
                    log.warning(
                        "the mailbox ignored %d keys; it ignores more without reporting each", MAX_REPORTED
                    )
                return
            self._reported.add(key)
        hook(key, reason)  # outside the lock: the hook may use the mailbox


class Wrapper:
    """What a mailbox wrapper (faulty.py, metered.py) passes through to the mailbox it wraps, `inner`: its
    clock, and its `on_ignored` hook, so that reading or setting the hook here reads or sets it there."""

    inner: object

    def clock(self) -> float:
        return self.inner.clock()  # type: ignore[attr-defined]

    @property
    def on_ignored(self) -> IgnoredHook:
        return self.inner.on_ignored  # type: ignore[attr-defined]

    @on_ignored.setter
    def on_ignored(self, hook: IgnoredHook) -> None:
        self.inner.on_ignored = hook  # type: ignore[attr-defined]
