"""DiLoCo and its streaming and decoupled forms, as one validated configuration.

The parts: a partition (which tensors form each fragment), the staggered schedule, outer Nesterov,
a merge rule, and the mixing applied when a commit arrives. Defaults follow Decoupled DiLoCo; with
fragments=1, overlap_steps=0 and quorum_size equal to the node count it is standard DiLoCo
(research/algorithms.md §1–§3). `to_dict()` is what run.json records and every joiner compares.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..arrays import Arrays, zeros_like
from ..errors import ConfigError, PayloadError
from ..frameworks.base import adapter_for
from ..wire.topk import TopK, parse_topk
from .damping import damp_opposed
from .merge import MergeRule, WeightedMean
from .method import Rounds, WireOptions
from .outer import FULL_ROUND, OuterOptimizer, OuterState, RoundShape, outer_nesterov, outer_nesterov_by_share
from .partition import BalancedBytes, Schema, Strided
from .schedule import fragment_offsets

DTYPE_NAMES = (None, "F32", "F16", "BF16", "F8_E4M3", "F8_E4M3_TENSOR", "F4")


def _check_dtype(config: object, name: str) -> None:
    """A dtype name, or a TopK (kept as its canonical name, which is what to_dict and payloads record)."""
    value = getattr(config, name)
    if isinstance(value, TopK):
        object.__setattr__(config, name, value.name)
    elif isinstance(value, str) and value.startswith("TOPK("):
        try:
            parse_topk(value)
        except PayloadError as error:
            raise ConfigError(f"{name}={value!r}: {error}") from None
    elif value not in DTYPE_NAMES:
        raise ConfigError(f"{name}={value!r} is not a wire dtype; use one of {DTYPE_NAMES} or sl.TopK(...)")


@dataclass(frozen=True, kw_only=True)
class DiLoCo:
    """sync_every (H): local steps between two syncs of a fragment.
    fragments: how many parameter groups sync on staggered phases (Streaming DiLoCo); 1 syncs all at once.
    partition: Strided() deals transformer blocks round the fragments; BalancedBytes() packs by size.
    in_flight: most of this node's contributions awaiting their commit at once (default: one per
        fragment); a fragment due beyond it waits, its steps kept, until one commits. Each costs one
        fragment of host memory. Below `fragments` it needs quorum_size=1 (see __post_init__).
    overlap_steps (τ): wait once a contribution made τ steps ago is not yet committed; 0 is DiLoCo's
        barrier; None never waits.
    mixing (α): aligning with a commit that holds this node's contribution sets θ ← α·θ + (1−α)·Θ
        (Streaming DiLoCo; 0 replaces the steps trained meanwhile). None (default) carries those steps
        onto the commit instead, θ ← θ + (Θ − θ_snapshot), so no step is lost when a round is slow.
    outer_lr (η), outer_momentum (μ), nesterov: the outer optimizer.
    adaptive_outer: a round that merged a share c of the live nodes moves the model by c of a full
        round, and a stale round (no barrier, contributions spanning more than one sync) by c·Δ without
        the momentum push (docs/decoupled.md); barrier rounds with every node are plain outer Nesterov.
    damp_momentum: before a round's outer step, scale the Nesterov buffer by (1 + cos)² when the merged Δ
        points against it (cos < 0; algorithms/damping.py). None (default): on without a barrier
        (overlap_steps=None), where steps carried from rounds in flight make the momentum oscillate; off
        with one, so standard and Streaming DiLoCo stay exact to their definitions.
    merge: how a round's contributions combine; quorum_size: contributions a round waits for.
    max_norm_ratio: reject a contribution whose Δ's L2 norm exceeds this many times the median of the
        round's other contributions' norms (with 3 or more contributions); None accepts any norm.
    grace_seconds: how long a round with a quorum waits for other live nodes (None: adaptive).
    global_batch_size: the batch the live nodes share; session.batch_size is this node's part.
    delta_dtype / commit_dtype: wire encodings of contributions and of commits' changes (commit_dtype
        defaults to delta_dtype, a TopK's scaled to hold quorum_size nodes' picks in bf16; "F32" commits
        the full parameters every round). With a lossy commit encoding, a commit is its change, and the
        full parameters go out as a snapshot every few rounds.
        sl.TopK(fraction=1/64, chunk=64, values="2bit") sends the top of each chunk (wire/topk.py), with
        error feedback always, and is recorded by its name.
    error_feedback: keep each node's encoding error and add it to its next contribution.
    snapshot_every: with a lossy commit encoding, the rounds between two snapshots of the full parameters
        and outer state (None: so that snapshots add at most half to the commits' bytes, and at most 32).
    flush_on_close: publish the steps trained since the last sync when a node leaves.
    """

    sync_every: int
    fragments: int = 1
    partition: Strided | BalancedBytes = field(default_factory=BalancedBytes)
    in_flight: int | None = None
    overlap_steps: int | None = None
    mixing: float | None = None
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    adaptive_outer: bool = True
    damp_momentum: bool | None = None
    merge: MergeRule = field(default_factory=WeightedMean)
    quorum_size: int = 1
    max_norm_ratio: float | None = 10.0
    grace_seconds: float | None = None
    global_batch_size: int | None = None
    delta_dtype: str | TopK | None = None
    commit_dtype: str | TopK | None = None
    error_feedback: bool = False
    snapshot_every: int | None = None
    flush_on_close: bool = False

    def __post_init__(self) -> None:
        _require_int("sync_every", self.sync_every, 1, None, "local steps between syncs, e.g. sync_every=100")
        _require_int("fragments", self.fragments, 1, self.sync_every, f"at most sync_every={self.sync_every}")
        if self.in_flight is not None:
            _require_int(
                "in_flight", self.in_flight, 1, self.fragments, f"between 1 and fragments={self.fragments}"
            )
        if self.overlap_steps is not None:
            _require_int(
                "overlap_steps", self.overlap_steps, 0, self.sync_every - 1,
                f"0 (DiLoCo's barrier) up to sync_every-1={self.sync_every - 1}, or None never to wait",
            )  # fmt: skip
        if self.mixing is not None:
            _require_float(
                "mixing", self.mixing, 0.0, 1.0, upper_open=True, hint="0 replaces, 0.5 keeps half"
            )
        _require_float("outer_lr", self.outer_lr, 0.0, 10.0, lower_open=True, hint="DiLoCo uses 0.7")
        _require_float(
            "outer_momentum", self.outer_momentum, 0.0, 1.0, upper_open=True, hint="DiLoCo uses 0.9"
        )
        if not (self.damp_momentum is None or isinstance(self.damp_momentum, bool)):
            raise ConfigError(
                f"damp_momentum={self.damp_momentum!r} must be True, False or None (on without a barrier)"
            )
        _require_int("quorum_size", self.quorum_size, 1, None, "1 merges as soon as one node contributes")
        if self.quorum_size > 1 and self.max_in_flight < self.fragments:
            # Two nodes out of phase could each hold the only slot the other's round waits for, forever.
            raise ConfigError(
                f"in_flight={self.in_flight} with quorum_size={self.quorum_size} and fragments={self.fragments} can "
                "deadlock: a round waiting for several nodes needs every fragment free to publish; "
                f"use in_flight={self.fragments} (the default) or quorum_size=1"
            )
        if self.max_norm_ratio is not None:
            _require_float("max_norm_ratio", self.max_norm_ratio, 1.0, 1e12, lower_open=True,
                           hint="10 rejects blow-ups, not honest spread; None turns the check off")  # fmt: skip
        if self.grace_seconds is not None:
            _require_float("grace_seconds", self.grace_seconds, 0.0, 3600.0, hint="None adapts to step times")
        if self.snapshot_every is not None:
            _require_int(
                "snapshot_every", self.snapshot_every, 1, 32, "rounds between snapshots; None chooses"
            )
        if self.global_batch_size is not None:
            _require_int(
                "global_batch_size", self.global_batch_size, 1, None, "the samples all nodes share a step"
            )
        for name in ("delta_dtype", "commit_dtype"):
            _check_dtype(self, name)
        if not isinstance(self.partition, Strided | BalancedBytes):
            raise ConfigError(f"partition={self.partition!r} must be sl.Strided() or sl.BalancedBytes()")
        if not hasattr(self.merge, "merge") or not hasattr(self.merge, "weight"):
            raise ConfigError(f"merge={self.merge!r} must be a merge rule such as sl.WeightedMean()")

    @property
    def damps_momentum(self) -> bool:
        return self.overlap_steps is None if self.damp_momentum is None else self.damp_momentum

    @property
    def max_in_flight(self) -> int:
        return self.in_flight if self.in_flight is not None else self.fragments

    def plan(self, schema: Schema) -> list[list[str]]:
        return self.partition.plan(schema, self.fragments)

    def plan_for(self, model: object, *, params: object = None) -> list[list[str]]:
        """The fragments a run of this configuration makes of `model`, each a list of tensor names, fragment
        0 first; `params` as given to sl.Session. Print it to see what syncs together before a run."""
        return self.plan(adapter_for(model, params).schema)

    def plan_shortfall(self, plan: list[list[str]]) -> tuple[int, str] | None:
        """(fragments asked, why) when `plan` has fewer fragments than asked, else None."""
        if len(plan) >= self.fragments:
            return None
        return self.fragments, (
            f"fragments={self.fragments}, but {self.partition.fewer(plan)}: the run syncs {len(plan)} "
            "fragments, each larger than asked. See the plan before a run with sl.DiLoCo(...).plan_for(model)"
        )

    def offsets(self, fragment_count: int) -> list[int]:
        return fragment_offsets(self.sync_every, fragment_count)

    def outer_optimizer(self) -> OuterOptimizer:
        build = outer_nesterov_by_share if self.adaptive_outer else outer_nesterov
        return build(self.outer_lr, self.outer_momentum, nesterov=self.nesterov)

    # ---- the engine's members (algorithms/method.py) ------------------------------------------------

    def rounds(self, fragments: int) -> Rounds:
        return Rounds(
            sync_every=self.sync_every, offsets=tuple(self.offsets(fragments)), in_flight=self.max_in_flight,
            overlap_steps=self.overlap_steps, mixing=self.mixing, quorum_size=self.quorum_size,
            grace_seconds=self.grace_seconds, max_norm_ratio=self.max_norm_ratio,
            flush_on_close=self.flush_on_close, global_batch_size=self.global_batch_size,
        )  # fmt: skip

    def wire(self) -> WireOptions:
        commit_dtype = self.commit_dtype if self.commit_dtype is not None else self._default_commit_dtype()
        # Top-k leaves most of a Δ out: without feedback it would be lost for good, so TopK always keeps it.
        feedback = self.error_feedback or str(self.delta_dtype).startswith("TOPK(")
        return WireOptions(delta_dtype=self.delta_dtype, commit_dtype=commit_dtype, error_feedback=feedback,
                           snapshot_every=self.snapshot_every)  # fmt: skip

    def _default_commit_dtype(self) -> str | None:
        """A commit's change goes out in the deltas' encoding: a run that sends 4-bit deltas downloads 4-bit
        commits too. Not so for top-k: a commit is the mean of the round's sparse Δs, each node's picks its
        own, and the deltas' TopK would pick again (and requantize) the top of that mean, holding most of
        each round's change back in the merger's residual (+4.4% held-out loss against F32 DiLoCo, where
        commits of the whole mean gave +1.3%: benchmarks/demo_study.py). So a round of quorum_size
        contributions commits its sparse mean whole: quorum_size times the fraction, values in bf16."""
        if not str(self.delta_dtype).startswith("TOPK("):
            return self.delta_dtype
        topk = parse_topk(self.delta_dtype)
        fraction = min(1.0, topk.fraction * self.quorum_size)
        return TopK(fraction=fraction, chunk=topk.chunk, values="bf16", scale=topk.scale).name

    def weight(self, samples: int, steps: int) -> float:
        return self.merge.weight(samples, steps)

    def combine(self, contributions: Iterable[tuple[Arrays, float]]) -> Arrays:
        return self.merge.merge(contributions)

    def init_state(self, anchor: Arrays) -> Arrays:
        """The Nesterov buffer, zero; none without momentum (its buffer would always be Δ)."""
        if self.outer_momentum == 0:
            return {}
        return {name: zeros_like(values) for name, values in anchor.items()}

    def outer_step(
        self,
        delta: Arrays,
        state: Arrays,
        anchor: Arrays,
        *,
        flush_only: bool,
        shape: RoundShape = FULL_ROUND,
    ) -> tuple[Arrays, Arrays]:
        """Outer Nesterov on the merged Δ; a round of final contributions only applies Δ once, momentum
        untouched. `shape` is the round's share of the live nodes, and whether it was stale."""
        use_momentum = self.outer_momentum > 0 and not flush_only
        if use_momentum and self.damps_momentum:
            state = damp_opposed(delta, state)
        extra = {"shape": shape} if self.adaptive_outer else {}
        params, after = self.outer_optimizer().update(
            delta, OuterState(state), anchor, use_momentum=use_momentum, **extra
        )
        return params, after.momentum

    def to_dict(self) -> dict:
        """The canonical configuration: what every node of one run must agree on."""
        return {
            "method": "DiLoCo",
            "sync_every": self.sync_every,
            "fragments": self.fragments,
            "partition": self.partition.to_dict(),
            "in_flight": self.max_in_flight,
            "overlap_steps": self.overlap_steps,
            "mixing": self.mixing,
            "outer_lr": self.outer_lr,
            "outer_momentum": self.outer_momentum,
            "nesterov": self.nesterov,
            "adaptive_outer": self.adaptive_outer,
            "damp_momentum": self.damp_momentum,
            "merge": self.merge.to_dict(),
            "quorum_size": self.quorum_size,
            "max_norm_ratio": self.max_norm_ratio,
            "grace_seconds": self.grace_seconds,
            "global_batch_size": self.global_batch_size,
            "delta_dtype": self.delta_dtype,
            "commit_dtype": self.commit_dtype,
            "error_feedback": self.error_feedback,
            "snapshot_every": self.snapshot_every,
            "flush_on_close": self.flush_on_close,
        }


def _require_int(name: str, value: object, low: int, high: int | None, hint: str) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        valid = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigError(f"{name}={value!r} is invalid: it must be an integer {valid} ({hint})")


def _require_float(
    name: str,
    value: object,
    low: float,
    high: float,
    *,
    lower_open: bool = False,
    upper_open: bool = False,
    hint: str,
) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok:
        ok = (value > low if lower_open else value >= low) and (value < high if upper_open else value <= high)
    if not ok:
        valid = f"{'(' if lower_open else '['}{low}, {high}{')' if upper_open else ']'}"
        raise ConfigError(f"{name}={value!r} is invalid: it must be a number in {valid} ({hint})")
