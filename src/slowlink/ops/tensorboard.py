"""Session metrics and events on TensorBoard, through any writer with `add_scalar` (torch's
`torch.utils.tensorboard.SummaryWriter`, which needs the `tensorboard` package, or tensorboardX)."""

from __future__ import annotations

import os

from ..errors import ConfigError
from ..events import WARNING_KINDS, Event
from .trackers import MetricsTracker


class TensorBoardMetrics(MetricsTracker):
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
        super().__init__(prefix)
        self.writer = writer

    def _write(self, scalars: dict[str, int | float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, float(value), step)

    def __call__(self, event: Event) -> None:
        super().__call__(event)
        if event.kind in WARNING_KINDS and hasattr(self.writer, "add_text"):
            self.writer.add_text(f"{self.prefix}warnings", str(event), self._step)

    def close(self) -> None:
        """Flush what the writer holds (the writer stays the caller's to close)."""
        self.writer.flush()
