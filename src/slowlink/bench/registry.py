"""The bench's methods, one entry each: a name, a line saying what it is, and how to run it on the task.

A method of rounds (a DiLoCo configuration, DiLoCo with a sparse encoding) is one `rounds(...)` line: a
function from the options to the method, and the workers' speeds; a gossip method one `gossip(...)` line. A
method with its own exchange (DDP, DeMo) gives its own runner (runners.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..algorithms.diloco import DiLoCo
from ..algorithms.gossip import GossipDiLoCo, GossipMethod
from ..algorithms.method import Method
from ..algorithms.noloco import NoLoCo
from ..wire.topk import TopK
from .config import BenchConfig
from .outcome import Outcome
from .runners import Progress, run_ddp, run_demo, run_gossip, run_rounds
from .task import Task

Runner = Callable[[str, "Task", BenchConfig, Progress], Outcome]


@dataclass(frozen=True)
class Entry:
    name: str
    summary: str  # what it is, for the table's legend and docs/bench.md
    run: Runner
    method: Callable[[BenchConfig], object] | None = None  # the slowlink method it runs, where it is one


def rounds(name: str, summary: str, method: Callable[[BenchConfig], Method],
           speeds: Callable[[BenchConfig], list[float]] | None = None) -> Entry:  # fmt: skip
    """An entry for a method the simulator runs, its rounds through the config's exchange; every worker at
    step_time unless `speeds` says otherwise."""

    def run(entry: str, task: Task, config: BenchConfig, progress: Progress) -> Outcome:
        pace = speeds(config) if speeds is not None else [config.step_time] * config.workers
        return run_rounds(entry, method(config), task, config, pace, progress)

    return Entry(name, summary, run, method)


def gossip(name: str, summary: str, method: Callable[[BenchConfig], GossipMethod]) -> Entry:
    """An entry for a gossip method, run by the gossip simulator over pairwise links."""

    def run(entry: str, task: Task, config: BenchConfig, progress: Progress) -> Outcome:
        return run_gossip(entry, method(config), task, config, progress)

    return Entry(name, summary, run, method)


def diloco(config: BenchConfig, delta_dtype: TopK | None = None) -> DiLoCo:
    """Standard DiLoCo: one fragment, a barrier every H steps that waits for every worker."""
    return DiLoCo(sync_every=config.sync_every, quorum_size=config.workers, overlap_steps=0,
                  delta_dtype=delta_dtype, flush_on_close=True)  # fmt: skip


# Every mix waits for its values up to an hour, the longest the methods allow: far longer than any mix takes
# at the bench's links (90 s for the model's all-reduce by default), so every mix waits for its values, as in
# the FGDiLoCo paper's time model, and a run does not depend on timing (a partner left out is noted in the
# outcome). Mix2 of the local variants mixes the embeddings and block 0, as the paper mixes embeddings, head
# and first layers.
WAIT_ALWAYS = 3600.0
MIX2_PARAMS = r"emb|blocks\.0\."


def fgdiloco(variant: str):
    def method(config: BenchConfig) -> GossipDiLoCo:
        local = variant != "GlobalM1"
        return GossipDiLoCo(sync_every=config.sync_every, variant=variant, seed=config.seed,
                            mix2_params=MIX2_PARAMS if local else None, mix1_seconds=WAIT_ALWAYS,
                            mix2_seconds=WAIT_ALWAYS)  # fmt: skip

    return method


def noloco(config: BenchConfig) -> NoLoCo:
    """NoLoCo at H/2 (research/algorithms.md §8): pairs, slow weights and Δ each round."""
    return NoLoCo(sync_every=max(1, config.sync_every // 2), seed=config.seed, mix1_seconds=WAIT_ALWAYS,
                  mix_seconds=WAIT_ALWAYS)  # fmt: skip


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
    rounds(
        "diloco-topk",
        "DiLoCo with sparse deltas: top 1/64 of each 64×64 chunk, 2-bit values, error feedback",
        lambda config: diloco(config, TopK()),
    ),  # fmt: skip
    gossip(
        "gossip-m1",
        "Factored Gossip DiLoCo GlobalM1: global mix of the starts, no Mix2",
        fgdiloco("GlobalM1"),
    ),
    gossip(
        "gossip-m1-m2pairs",
        "GlobalM1LocalM2: global mix of the starts, pairs mix Δ of the embeddings and block 0",
        fgdiloco("GlobalM1LocalM2"),
    ),  # fmt: skip
    gossip(
        "gossip-pairs",
        "LocalM1M2: pairs mix the starts and Δ of the embeddings and block 0",
        fgdiloco("LocalM1M2"),
    ),  # fmt: skip
    gossip("noloco", "NoLoCo, H/2: random pairs mix slow weights and Δ, heavy-ball 0.5", noloco),
    Entry("demo", "DeMo: top-k of each 64×64 DCT chunk of momentum, sign step, every step", run_demo),
]
METHODS = {entry.name: entry for entry in ENTRIES}
