"""What the dashboard adapters share (TensorBoard, Weights & Biases): events counted by kind as they come,
from any thread, and `session.metrics()` with those counts turned into scalars by name at one step."""

from __future__ import annotations

import threading
from collections import Counter

from ..events import Event


class MetricsTracker:
    """Counts events by kind (pass the object as `on_event`) and logs `session.metrics()` with the counts
    under `prefix`; a subclass says in `_write` how a dict of scalars reaches its dashboard."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.events: Counter[str] = Counter()
        self._lock = threading.Lock()  # events come from the training and the communication thread
        self._step = 0  # the step of the last log: where what a subclass writes between two logs goes

    def log(self, session: object, step: int | None = None) -> dict:
        """Write every metric of `session.metrics()` that has a value, at `step` (default: the session's
        own step), and the event counts so far as `events/<kind>`; returns the metrics written."""
        metrics = {name: value for name, value in session.metrics().items() if value is not None}
        self._step = int(metrics.get("step", 0)) if step is None else step
        with self._lock:
            counts = dict(self.events)
        scalars = {f"{self.prefix}{name}": value for name, value in metrics.items()}
        scalars.update((f"{self.prefix}events/{kind}", count) for kind, count in sorted(counts.items()))
        self._write(scalars, self._step)
        return metrics

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.events[event.kind] += 1

    def _write(self, scalars: dict[str, int | float], step: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} must say how scalars reach its dashboard: _write")
