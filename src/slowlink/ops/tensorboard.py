"""Session metrics and events on TensorBoard, through any writer with `add_scalar` (torch's
`torch.utils.tensorboard.SummaryWriter`, which needs the `tensorboard` package, or tensorboardX)."""

from __future__ import annotations

import os
import threading
from collections import Counter

from ..errors import ConfigError
from ..events import WARNING_KINDS, Event


class TensorBoardMetrics:
    """Logs `session.metrics()` as scalars under `prefix`, and counts events as they come.

    writer: a SummaryWriter (or anything with add_scalar(tag, value, step)); or log_dir: where a new
    torch SummaryWriter writes. Pass the object as `on_event` to count events per kind (warnings are also
    logged as text); call `log(session)` every so often from the training loop, e.g. at every sync.
    """

    def __init__(self, writer: object = None, *, log_dir: str | os.PathLike | None = None,
                 prefix: str = "slowlink/") -> None:  # fmt: skip
        if writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as error:
                raise ConfigError(
                    f"TensorBoardMetrics needs a writer, or torch and tensorboard to make one ({error}): "
                    "pip install tensorboard"
                ) from error
            writer = SummaryWriter(log_dir=None if log_dir is None else str(log_dir))
        self.writer, self.prefix = writer, prefix
        self.events: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._step = 0

    def log(self, session: object, step: int | None = None) -> dict:
        """Write every metric of `session.metrics()` that has a value, at `step` (default: the session's
        own step), and the event counts so far; returns the metrics written."""
        metrics = {name: value for name, value in session.metrics().items() if value is not None}
        self._step = int(metrics.get("step", 0)) if step is None else step
        for name, value in metrics.items():
            self.writer.add_scalar(f"{self.prefix}{name}", float(value), self._step)
        with self._lock:
            counts = dict(self.events)
        for kind, count in sorted(counts.items()):
            self.writer.add_scalar(f"{self.prefix}events/{kind}", count, self._step)
        return metrics

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.events[event.kind] += 1
        if event.kind in WARNING_KINDS and hasattr(self.writer, "add_text"):
            self.writer.add_text(f"{self.prefix}warnings", str(event), self._step)

    def close(self) -> None:
        """Flush what the writer holds (the writer stays the caller's to close)."""
        self.writer.flush()
