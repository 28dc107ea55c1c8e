"""NoLoCo (research/algorithms.md §5), as its official code updates: random groups G of n nodes per round
(drawn from the seed and the round), the same group for both exchanges. With Δ_i = x_i − θ_i (DiLoCo's
sign; the paper's Δ is the opposite, θ − φ, so its +β·mean Δ is −β·mean Δ here):
    δ_i ← α·δ_i − β·mean_{j∈G} Δ_j + γ·(mean_{j∈G} x_j − x_i) ;  x_i ← x_i + δ_i
α = outer_momentum (heavy-ball, though the code calls it Nesterov), β = outer_lr, γ = consensus_lr (the
code: γ = β). With G = every node this is heavy-ball DiLoCo. The slow weights x go out as the round starts
(overlapped), Δ at its end (blocking).
"""

from collections.abc import Mapping
from dataclasses import dataclass

from ..arrays import Arrays, zeros_like
from ..errors import ConfigError
from .gossip import DELTA, START, Exchange, check_common, one_fragment
from .matching import anchored_mean_of_group, mean_of_group
from .partition import Schema

GROUPS = 0  # NoLoCo draws one set of groups per round, for both exchanges


@dataclass(frozen=True, kw_only=True)
class NoLoCo:
    """sync_every (H): inner steps per round. group_size (n): nodes per group (2: pairs). outer_lr (β),
    outer_momentum (α), consensus_lr (γ, None: = outer_lr as the official code). seed: draws the groups.
    nodes: the roster's size over a mailbox. mix_seconds: how long the Δ exchange waits for the group;
    mix1_seconds: how long a round's end waits for slow weights still on their way (0: never)."""

    sync_every: int
    group_size: int = 2
    outer_lr: float = 0.7
    outer_momentum: float = 0.5
    consensus_lr: float | None = None
    seed: int = 0
    nodes: int | None = None
    mix_seconds: float = 60.0
    mix1_seconds: float = 0.0

    def __post_init__(self) -> None:
        check_common(
            self.sync_every, self.seed, self.nodes, self.mix_seconds, "mix_seconds", self.mix1_seconds
        )
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2:
            raise ConfigError(f"group_size={self.group_size!r} must be an integer >= 2 (NoLoCo uses 2)")
        for name, hint in (("outer_lr", "NoLoCo uses 0.7"), ("consensus_lr", "None: the outer_lr")):
            value = getattr(self, name)
            if value is None and name == "consensus_lr":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 10:
                raise ConfigError(f"{name}={value!r} must be a number in (0, 10] ({hint})")
        if not 0.0 <= self.outer_momentum < 1.0:
            raise ConfigError(f"outer_momentum={self.outer_momentum!r} must be in [0, 1) (NoLoCo uses 0.5)")

    @property
    def name(self) -> str:
        return "NoLoCo"

    def plan(self, schema: Schema) -> list[list[str]]:
        return one_fragment(schema)

    def exchanges(self, names: list[str], nodes: int) -> tuple[Exchange, ...]:
        size = min(self.group_size, nodes)
        return (
            Exchange(START, GROUPS, size, False, tuple(names)),
            Exchange(DELTA, GROUPS, size, True, tuple(names)),
        )

    def init_state(self, params: Arrays) -> Arrays:
        """δ, the heavy-ball velocity, zero."""
        return {name: zeros_like(values) for name, values in params.items()}

    def mix(self, exchange: Exchange, values: Mapping[int, Arrays]) -> Arrays:
        return anchored_mean_of_group(values) if exchange.carries == START else mean_of_group(values)

    def update(
        self, start: Arrays, mixed_start: Arrays, mixed_delta: Arrays, state: Arrays
    ) -> tuple[Arrays, Arrays]:
        alpha, beta = float(self.outer_momentum), float(self.outer_lr)
        gamma = float(self.consensus_lr if self.consensus_lr is not None else self.outer_lr)
        velocity = {
            name: alpha * state[name] - beta * mixed_delta[name] + gamma * (mixed_start[name] - start[name])
            for name in start
        }
        return {name: start[name] + velocity[name] for name in start}, velocity

    def to_dict(self) -> dict:
        return {
            "method": "NoLoCo", "sync_every": self.sync_every, "group_size": self.group_size,
            "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum,
            "consensus_lr": self.consensus_lr, "seed": self.seed, "nodes": self.nodes,
            "mix_seconds": self.mix_seconds, "mix1_seconds": self.mix1_seconds,
        }  # fmt: skip
