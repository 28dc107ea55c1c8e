"""What one method's run gives the table and the plots: its held-out loss, its curve, its bytes and its
simulated time. Every runner (runners.py) returns one Outcome; report.py draws them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outcome:
    name: str  # the registry's name
    heldout_loss: float  # nats per byte, the final (committed or shared) model, held-out files
    curve: list[
        tuple[int, float, float]
    ]  # (step, simulated seconds when every worker had done it, train loss)
    bytes_sent: float  # per worker, mean over workers, the whole run
    bytes_received: float
    peak_bytes_per_sync: int  # the most one worker sends in one sync
    simulated_seconds: float  # until the last worker left
    utilization: float  # compute time / simulated time, mean over workers
    samples: int  # sequences trained on, all workers
    syncs: int  # rounds committed (DDP, DeMo: steps)
    real_seconds: float = 0.0  # how long the run took on this machine
    cpu_seconds: float = 0.0  # of this process, every thread: what an idle machine would take, about
    notes: list[str] = field(default_factory=list)

    @property
    def bytes_per_worker(self) -> float:
        return self.bytes_sent + self.bytes_received

    def to_dict(self) -> dict:
        return {**self.__dict__, "bytes_per_worker": self.bytes_per_worker}


def merged_curve(points: list[list[tuple[int, float, float]]]) -> list[tuple[int, float, float]]:
    """One curve from each worker's (step, time, loss): at each step the time the slowest worker reached
    it and the workers' mean loss."""
    curve = []
    for rows in zip(*points, strict=False):
        curve.append((rows[0][0], max(r[1] for r in rows), sum(r[2] for r in rows) / len(rows)))
    return curve
