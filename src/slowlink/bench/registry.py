"""The bench's methods, one entry each: a name, a line saying what it is, and how to run it on the task.

A method of rounds (any slowlink method the simulator runs: a DiLoCo configuration, a gossip method, DiLoCo
with a sparse encoding) is one `rounds(...)` line: a function from the options to the method, and the
workers' speeds. A method with its own exchange (DDP, DeMo) gives its own runner (runners.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..algorithms.diloco import DiLoCo
from ..algorithms.method import Method
from .config import BenchConfig
from .outcome import Outcome
from .runners import Progress, run_ddp, run_demo, run_rounds
from .task import Task

Runner = Callable[[str, "Task", BenchConfig, Progress], Outcome]


@dataclass(frozen=True)
class Entry:
    name: str
    summary: str  # what it is, for the table's legend and docs/bench.md
    run: Runner


def rounds(name: str, summary: str, method: Callable[[BenchConfig], Method],
           speeds: Callable[[BenchConfig], list[float]] | None = None, exchange: str | None = None) -> Entry:  # fmt: skip
    """An entry for a method the simulator runs; every worker at step_time unless `speeds` says otherwise,
    its messages through the config's exchange unless `exchange` names the one it needs ("pairwise")."""

    def run(entry: str, task: Task, config: BenchConfig, progress: Progress) -> Outcome:
        pace = speeds(config) if speeds is not None else [config.step_time] * config.workers
        return run_rounds(entry, method(config), task, config, pace, progress, exchange)

    return Entry(name, summary, run)


def diloco(config: BenchConfig) -> DiLoCo:
    """Standard DiLoCo: one fragment, a barrier every H steps that waits for every worker."""
    return DiLoCo(
        sync_every=config.sync_every, quorum_size=config.workers, overlap_steps=0, flush_on_close=True
    )


def streaming(config: BenchConfig, delta_dtype: str | None = None) -> DiLoCo:
    """Streaming DiLoCo: P fragments synced in turn, each landing τ steps late and mixed in with α = 0.5."""
    return DiLoCo(sync_every=config.sync_every, fragments=config.fragments, overlap_steps=config.overlap_steps,
                  mixing=0.5, quorum_size=config.workers, delta_dtype=delta_dtype, flush_on_close=True)  # fmt: skip


def decoupled(config: BenchConfig) -> DiLoCo:
    """Decoupled DiLoCo: DiLoCo's defaults, quorum 1 and no barrier; nobody waits for anybody."""
    return DiLoCo(sync_every=config.sync_every, fragments=config.fragments, flush_on_close=True)


def half_slow(config: BenchConfig) -> list[float]:
    return config.speeds(2.0)


ENTRIES = [
    Entry("ddp", "data parallel: fp32 gradients averaged every step by a ring all-reduce", run_ddp),
    rounds("diloco", "DiLoCo, H steps, outer Nesterov 0.7/0.9, a barrier each round", diloco),
    rounds("streaming", "Streaming DiLoCo: P fragments, overlap τ, mixing 0.5, fp32 deltas", streaming),
    rounds(
        "streaming-f4",
        "Streaming DiLoCo as above, deltas in F4 (4-bit E2M1)",
        lambda config: streaming(config, "F4"),
    ),  # fmt: skip
    rounds("decoupled", "Decoupled DiLoCo: P fragments, quorum 1, no barrier", decoupled),
    rounds("decoupled-1:2", "Decoupled DiLoCo, half the workers twice as slow", decoupled, half_slow),
    rounds("diloco-1:2", "DiLoCo with its barrier, half the workers twice as slow", diloco, half_slow),
    Entry("demo", "DeMo: top-k of each 64×64 DCT chunk of momentum, sign step, every step", run_demo),
]
METHODS = {entry.name: entry for entry in ENTRIES}
