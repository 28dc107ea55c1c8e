"""Who mixes with whom in a gossip round, and what mixing a group does (research/algorithms.md §4.3, §5).

Groups are drawn from (seed, round, mix) alone, so every node computes the same ones without talking: a
permutation of the M nodes dealt into groups of n (pairs: n = 2; with M odd one node idles). "global" is
one group of all, None no mixing (each node alone). Mixing a group is the mean of its members' values;
a member whose values did not come is left out, so a node without its partner mixes with itself.
"""

from collections.abc import Mapping, Sequence

import numpy as np

from ..arrays import Arrays, zeros_like
from ..errors import ConfigError
from .merge import weighted_mean

MIX_KINDS = ("global", "pairs", None)


def groups(seed: int, round_: int, mix: int, nodes: int, size: int) -> list[tuple[int, ...]]:
    """The round's groups for one mix: a seeded permutation of range(nodes) dealt into `size`-sized
    groups, each sorted; a remainder forms a smaller group (a lone node mixes with itself)."""
    if nodes < 1 or size < 1:
        raise ConfigError(f"groups need nodes >= 1 and size >= 1, got nodes={nodes}, size={size}")
    if size >= nodes:
        return [tuple(range(nodes))]
    if size == 1:
        return [(node,) for node in range(nodes)]
    rng = np.random.default_rng(np.random.SeedSequence([seed, round_, mix]))
    order = [int(node) for node in rng.permutation(nodes)]
    return [tuple(sorted(order[start : start + size])) for start in range(0, nodes, size)]


def group_size(kind: str | None, nodes: int) -> int:
    """The group size of a mix kind among `nodes`: all of them, two, or one (no mixing)."""
    if kind == "global":
        return nodes
    if kind == "pairs":
        return 2
    if kind is None:
        return 1
    raise ConfigError(f"mix={kind!r} must be one of {MIX_KINDS}")


def group_of(node: int, drawn: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    return next(group for group in drawn if node in group)


def contraction(nodes: int, size: int) -> float:
    """ρ of random groups of `size` among `nodes`: E‖(W−J)X‖² = ρ‖(I−J)X‖², (M−n)/(n(M−1)) (§4.3)."""
    if size >= nodes:
        return 0.0
    if size <= 1:
        return 1.0
    return (nodes - size) / (size * (nodes - 1))


def consensus_factor(rho1: float, rho2: float) -> float:
    """F = 1 + ρ₂/(1−ρ₁), the factor of the consensus bound (§4.3); infinite without any Mix1."""
    return float("inf") if rho1 >= 1.0 else 1.0 + rho2 / (1.0 - rho1)


def mean_of_group(values: Mapping[int, Arrays]) -> Arrays:
    """Σ_j x_j / |G| over the members that came, in rank order: every member computes the same bits, and
    with every member present this is weighted_mean, DiLoCo's merge, exactly (how Mix2 = J equals DiLoCo)."""
    return weighted_mean((values[rank], 1.0) for rank in sorted(values))


def anchored_mean_of_group(values: Mapping[int, Arrays]) -> Arrays:
    """x_a + Σ_j (x_j − x_a) / |G|, a = the lowest rank that came: the same mean, written so that members
    that agree give their common value exactly (Mix1 of identical starts changes nothing, as DiLoCo)."""
    ranks = sorted(values)
    first = values[ranks[0]]
    count = float(len(ranks))
    out = {}
    for name, base in first.items():
        spread = sum(((values[rank][name] - base) for rank in ranks[1:]), start=zeros_like(base))
        out[name] = base + spread / count
    return out
