"""The one clock every wait and every time reading goes through: real time in real runs, virtual time in the
simulator and the property tests. A component is handed its clock; none reads `time` for itself.
"""

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale; only differences mean anything."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait until `event` is set or `seconds` have passed; True if it was set."""
        ...


class RealClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)

    def __repr__(self) -> str:
        return "RealClock()"


REAL = RealClock()


class VirtualClock:
    """Time that moves only when told to: `sleep` and `wait` move it on at once instead of blocking, so a run
    over it is a function of its inputs alone."""

    def __init__(self, start: float = 0.0) -> None:
        self.time = float(start)

    def now(self) -> float:
        return self.time

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self.time += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if not event.is_set():
            self.advance(max(0.0, seconds))
        return event.is_set()

    def __repr__(self) -> str:
        return f"VirtualClock(time={self.time})"
