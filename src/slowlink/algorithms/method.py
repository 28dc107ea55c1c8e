"""What a method is to the engine: its round-keeping (when fragments sync, who waits, when a round closes,
what a node does with a commit) and its reduction (how a round's pseudo-gradients become new parameters).

A method is a frozen value; every function here and in rounds.py is pure. DiLoCo (diloco.py) is one method,
and Streaming and Decoupled DiLoCo are configurations of it; a new method is a new value with these members
(docs/DESIGN-NOTES.md, "Adding a method").
"""

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, runtime_checkable

from ..arrays import Arrays
from .outer import RoundShape
from .partition import Schema


@dataclass(frozen=True, kw_only=True)
class Rounds:
    """The round-keeping every method shares (research/algorithms.md §1–§3).

    sync_every (H) and offsets: fragment q syncs at local steps offsets[q] + k·H, k ≥ 1.
    in_flight: most contributions awaiting their commit at once. overlap_steps (τ): a node waits at the
    τ-th step after a snapshot until its commit is in, and applies it exactly there; None never waits.
    mixing (α): a commit holding this node's contribution sets θ ← α·θ + (1−α)·Θ; None carries the steps
    trained since the snapshot onto the commit. A commit without it always carries every local step.
    quorum_size, grace_seconds: a round closes when every live node has contributed, or `quorum_size` have
    and the grace window since has passed (None: adaptive). max_norm_ratio: contributions this many times
    the others' norm are rejected (None: off). flush_on_close: publish unsent steps when leaving.
    """

    sync_every: int
    offsets: tuple[int, ...]
    in_flight: int
    overlap_steps: int | None = None
    mixing: float | None = None
    quorum_size: int = 1
    grace_seconds: float | None = None
    max_norm_ratio: float | None = None
    flush_on_close: bool = False
    global_batch_size: int | None = None

    @property
    def fragments(self) -> int:
        return len(self.offsets)

    @cached_property
    def phases(self) -> frozenset[int]:
        """The steps modulo H at which some fragment syncs: a step not among them syncs nothing."""
        return frozenset(offset % self.sync_every for offset in self.offsets)


@dataclass(frozen=True, kw_only=True)
class WireOptions:
    """How contributions and commits are encoded (wire/encodings.py); None is float32."""

    delta_dtype: str | None = None
    commit_dtype: str | None = None
    error_feedback: bool = False
    snapshot_every: int | None = None  # rounds between snapshots of a lossy commit encoding; None: automatic


@runtime_checkable
class Method(Protocol):
    """The members the engine calls. `to_dict` is what run.json records and every joiner compares; its
    "method" entry names the method. The state `init_state` makes is one array per tensor of the fragment
    (empty when the method keeps none), stored with each commit so that a new leader carries on from it.
    weight: a contribution's merge weight from the samples and steps it claims (bounded by the channel);
    combine: a round's (Δ, weight) pairs into one Δ, read one at a time (ValueError if none);
    outer_step: (new parameters, new state) from the combined Δ; flush_only when every contribution was
    a leaving node's last; shape: how many of the live nodes the round merged, and whether it was stale."""

    def to_dict(self) -> dict: ...

    def plan(self, schema: Schema) -> list[list[str]]: ...

    def rounds(self, fragments: int) -> Rounds: ...

    def wire(self) -> WireOptions: ...

    def weight(self, samples: int, steps: int) -> float: ...

    def combine(self, contributions: Iterable[tuple[Arrays, float]]) -> Arrays: ...

    def init_state(self, anchor: Arrays) -> Arrays: ...

    def outer_step(
        self, delta: Arrays, state: Arrays, anchor: Arrays, *, flush_only: bool, shape: RoundShape
    ) -> tuple[Arrays, Arrays]: ...
