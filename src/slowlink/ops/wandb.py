"""Session metrics and event counts on Weights & Biases, through a run (what `wandb.init(...)` returns, or
anything with `log(dict, step=...)`); the `wandb` package is needed only to find the active run."""

from __future__ import annotations

from ..errors import ConfigError
from .trackers import MetricsTracker


class WandbMetrics(MetricsTracker):
    """Logs `session.metrics()` as scalars under `prefix`, and counts events as they come.

    run: a W&B run, by default the active one (`wandb.run`). Pass the object as `on_event` to count events
    per kind; call `log(session)` every so often from the training loop, e.g. at every sync. W&B drops a
    step lower than one it has seen: if the loop logs figures of its own, give both the same step
    (`log(session, step=...)`). The run stays the caller's to finish.
    """

    def __init__(self, run: object = None, *, prefix: str = "slowlink/") -> None:
        if run is None:
            try:
                import wandb
            except ImportError as error:
                raise ConfigError(
                    f"WandbMetrics needs a run, or wandb to find the active one ({error}): pip install wandb"
                ) from error
            if wandb.run is None:
                raise ConfigError(
                    "WandbMetrics found no active W&B run: call wandb.init(...) first, or pass the run"
                )
            run = wandb.run
        super().__init__(prefix)
        self.run = run

    def _write(self, scalars: dict[str, int | float], step: int) -> None:
        # Not committed here: what the loop logs itself at the same step joins the same row.
        self.run.log(scalars, step=step)
