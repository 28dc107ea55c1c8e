"""Factored Gossip DiLoCo (research/algorithms.md §4; the update is our reconstruction, §4.1): no global
barrier; each node mixes its round's start with a few others while it trains (Mix1, non-blocking) and its
pseudo-gradient before its outer step (Mix2, blocking). One round r of node i, H = sync_every:
    θ ← x_i ; H inner steps ;  Δ_i = x_i − θ          (x_i: the round's start; Δ points downhill)
    y_i = Σ_j W1[i,j]·x_j ;  g_i = Σ_j W2[i,j]·Δ_j     (Mix1 overlapped with the steps; Mix2 blocks)
    b_i ← μ·b_i + g_i ;  x_i ← y_i − η·(g_i + μ·b_i)   (outer Nesterov, local momentum; η = outer_lr)
The engine's gossip driver (engine/gossip.py) does the exchanges; everything here is pure.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..arrays import Arrays, zeros_like
from ..errors import ConfigError
from .matching import MIX_KINDS, anchored_mean_of_group, group_size, mean_of_group
from .outer import OuterState, outer_nesterov
from .partition import Schema

START, DELTA = "start", "delta"  # what an exchange carries: the round's start x, or its Δ
VARIANTS = {  # the paper's variants (§4.2): (mix1, mix2)
    "DiLoCo": (None, "global"),
    "GlobalM1": ("global", None),
    "GlobalM1LocalM2": ("global", "pairs"),
    "LocalM1M2": ("pairs", "pairs"),
}


@dataclass(frozen=True)
class Exchange:
    """One exchange of a round: what it carries (START, published as the round starts, or DELTA, at its
    end), the id that seeds its groups, their size, whether the node waits for it, and which tensors."""

    carries: str
    mix: int
    size: int
    blocking: bool
    names: tuple[str, ...]


@runtime_checkable
class GossipMethod(Protocol):
    """What the gossip driver calls. exchanges: a round's exchanges among `nodes` for the model's tensor
    names; mix: one exchange's values by rank (this node's among them; members that did not come are
    absent) into the mixed values; update: the next round's start and state from the round's start, its
    mixed start (y), its mixed Δ (g) and the state. seed seeds the groups; mix_seconds bounds a blocking
    exchange's wait, mix1_seconds a non-blocking one's at the round's end; nodes is the roster's size over a mailbox (the simulator sets it)."""

    sync_every: int
    seed: int
    nodes: int | None
    mix_seconds: float
    mix1_seconds: float

    def to_dict(self) -> dict: ...

    def plan(self, schema: Schema) -> list[list[str]]: ...

    def exchanges(self, names: list[str], nodes: int) -> tuple[Exchange, ...]: ...

    def init_state(self, params: Arrays) -> Arrays: ...

    def mix(self, exchange: Exchange, values: Mapping[int, Arrays]) -> Arrays: ...

    def update(
        self, start: Arrays, mixed_start: Arrays, mixed_delta: Arrays, state: Arrays
    ) -> tuple[Arrays, Arrays]: ...


def pseudo_gradient(start: Arrays, trained: Arrays) -> Arrays:
    """Δ = x − θ, DiLoCo's sign (§0), for every exchange of every gossip method."""
    return {name: start[name] - trained[name] for name in start}


def one_fragment(schema: Schema) -> list[list[str]]:
    """Gossip methods mix the whole model each round: one fragment of every tensor."""
    return [[name for name, _, _ in schema]]


@dataclass(frozen=True, kw_only=True)
class GossipDiLoCo:
    """sync_every (H): inner steps per round. mix1, mix2: "global", "pairs" or None, for the round's start
    (overlapped with training) and for Δ (blocking); or variant= one of VARIANTS by name. mix2_params: a
    regex; Mix2 mixes only the tensors whose name it finds (the paper: embeddings, head, first layers),
    the others keep their own Δ. outer_lr (η), outer_momentum (μ), nesterov: the local outer optimizer.
    seed: draws the pairs. nodes: the roster's size over a mailbox. mix2_seconds: how long Mix2 waits for
    a partner before mixing with itself; mix1_seconds: how long a round's end waits for a Mix1 partner
    still on its way (0: never, the round mixes what has come; the paper's time model waits). fragments: 1 (gossip mixes the whole model each round)."""

    sync_every: int
    mix1: str | None = "global"
    mix2: str | None = "pairs"
    mix2_params: str | None = None
    variant: str | None = None
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    fragments: int = 1
    seed: int = 0
    nodes: int | None = None
    mix2_seconds: float = 60.0
    mix1_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.variant is not None:
            if self.variant not in VARIANTS:
                raise ConfigError(f"variant={self.variant!r} must be one of {sorted(VARIANTS)}")
            if (self.mix1, self.mix2) not in (("global", "pairs"), VARIANTS[self.variant]):
                raise ConfigError(
                    f"variant={self.variant!r} is mix1={VARIANTS[self.variant][0]!r}, mix2="
                    f"{VARIANTS[self.variant][1]!r}, but mix1={self.mix1!r}, mix2={self.mix2!r} were given: "
                    "give the variant or the mixes, not both"
                )
            object.__setattr__(self, "mix1", VARIANTS[self.variant][0])
            object.__setattr__(self, "mix2", VARIANTS[self.variant][1])
        for name in ("mix1", "mix2"):
            if getattr(self, name) not in MIX_KINDS:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be 'global', 'pairs' or None")
        check_common(
            self.sync_every, self.seed, self.nodes, self.mix2_seconds, "mix2_seconds", self.mix1_seconds
        )
        _require_number("outer_lr", self.outer_lr, 0.0, 10.0, "DiLoCo uses 0.7")
        if not 0.0 <= self.outer_momentum < 1.0:
            raise ConfigError(f"outer_momentum={self.outer_momentum!r} must be in [0, 1) (DiLoCo uses 0.9)")
        if self.fragments != 1:
            raise ConfigError(
                f"fragments={self.fragments!r}: GossipDiLoCo mixes the whole model each round; use fragments=1"
            )
        if self.mix2_params is not None:
            try:
                re.compile(self.mix2_params)
            except (re.error, TypeError) as error:
                raise ConfigError(
                    f"mix2_params={self.mix2_params!r} is not a regular expression: {error}"
                ) from None

    @property
    def name(self) -> str:
        return next((v for v, mixes in VARIANTS.items() if mixes == (self.mix1, self.mix2)), "GossipDiLoCo")

    @property
    def mix_seconds(self) -> float:
        return self.mix2_seconds

    def plan(self, schema: Schema) -> list[list[str]]:
        return one_fragment(schema)

    def exchanges(self, names: list[str], nodes: int) -> tuple[Exchange, ...]:
        found = tuple(names)
        if self.mix2_params is not None:
            found = tuple(name for name in names if re.search(self.mix2_params, name))
            if not found:
                raise ConfigError(
                    f"mix2_params={self.mix2_params!r} finds none of the model's tensors ({names[:4]}...); "
                    "give a pattern that finds some, e.g. 'emb|head|blocks\\.0\\.', or None to mix them all"
                )
        out = []
        if self.mix1 is not None:
            out.append(Exchange(START, 1, group_size(self.mix1, nodes), False, tuple(names)))
        if self.mix2 is not None:
            out.append(Exchange(DELTA, 2, group_size(self.mix2, nodes), True, found))
        return tuple(out)

    def init_state(self, params: Arrays) -> Arrays:
        """The local Nesterov buffer, zero; none without momentum."""
        if self.outer_momentum == 0:
            return {}
        return {name: zeros_like(values) for name, values in params.items()}

    def mix(self, exchange: Exchange, values: Mapping[int, Arrays]) -> Arrays:
        if exchange.carries == START:
            return anchored_mean_of_group(values)
        return mean_of_group(values)

    def update(
        self, start: Arrays, mixed_start: Arrays, mixed_delta: Arrays, state: Arrays
    ) -> tuple[Arrays, Arrays]:
        """Outer Nesterov from the mixed start y with the mixed Δ g: DiLoCo's step, anchored at y."""
        del start  # the outer step starts from the mixed start
        outer = outer_nesterov(self.outer_lr, self.outer_momentum, nesterov=self.nesterov)
        params, after = outer.update(mixed_delta, OuterState(state), mixed_start, use_momentum=bool(state))
        return params, after.momentum if state else {}

    def to_dict(self) -> dict:
        return {
            "method": "GossipDiLoCo", "sync_every": self.sync_every, "mix1": self.mix1, "mix2": self.mix2,
            "mix2_params": self.mix2_params, "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum,
            "nesterov": self.nesterov, "fragments": self.fragments, "seed": self.seed, "nodes": self.nodes,
            "mix2_seconds": self.mix2_seconds, "mix1_seconds": self.mix1_seconds,
        }  # fmt: skip


def check_common(
    sync_every: object, seed: object, nodes: object, seconds: object, seconds_name: str, mix1_seconds: object
) -> None:
    """The options every gossip method shares, checked with errors that name the fix."""
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise ConfigError(f"sync_every={sync_every!r} must be a positive integer: inner steps per round")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed={seed!r} must be an integer >= 0: it draws the groups")
    if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1):
        raise ConfigError(f"nodes={nodes!r} must be a positive integer: how many nodes the run has")
    _require_number(seconds_name, seconds, 0.0, 3600.0, "how long a blocking mix waits for a partner")
    if (
        isinstance(mix1_seconds, bool)
        or not isinstance(mix1_seconds, int | float)
        or not 0 <= mix1_seconds <= 3600
    ):
        raise ConfigError(f"mix1_seconds={mix1_seconds!r} must be in [0, 3600]: 0 never waits for Mix1")


def _require_number(name: str, value: object, low: float, high: float, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
        raise ConfigError(f"{name}={value!r} must be a number in ({low}, {high}] ({hint})")
