"""Merge rules: how a round's accepted pseudo-gradients become one.

WeightedMean:  Δ = Σ_m w_m·Δ_m / Σ_m w_m, with w_m the samples node m reports for the round
(research/algorithms.md §1, "Weighting"). Contributions stream in one at a time, so a merger holds
one running sum and one contribution, never all of them. Rules for runs with untrusted nodes
(TrimmedMean, NormClippedMean) are in robust.py, radial-directional averaging (RDA) in rda.py.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ..arrays import Arrays, zeros_like
from ..errors import ConfigError


class MergeRule(Protocol):
    """What a merger calls: the weight of a contribution, the merge of a round's (Δ, weight) pairs
    (ValueError when there are none), and the canonical configuration run.json records."""

    def to_dict(self) -> dict: ...

    def weight(self, samples: int, steps: int) -> float: ...

    def merge(self, contributions: Iterable[tuple[Arrays, float]]) -> Arrays: ...


WEIGHTS = ("samples", "quality")


def sample_weight(samples: int, steps: int, weights: str) -> float:
    """A contribution's weight: its samples, or with "quality" its samples × samples per step (Decoupled
    DiLoCo's token weights c_tokens²/c_steps, research/algorithms.md §3: quantity × quality). With equal
    batches the two are proportional; "quality" favours the node that trains more samples per step."""
    if weights == "quality":
        return float(samples) * float(samples) / max(steps, 1)
    return float(samples)


@dataclass(frozen=True)
class WeightedMean:
    """Mean of the contributions weighted by the samples each trained since its anchor ("samples"), or by
    samples × samples per step ("quality", Decoupled DiLoCo's token weights: see sample_weight)."""

    weights: str = "samples"

    def __post_init__(self) -> None:
        if self.weights not in WEIGHTS:
            raise ConfigError(
                f"WeightedMean(weights={self.weights!r}): choose one of {', '.join(map(repr, WEIGHTS))}"
            )

    def to_dict(self) -> dict:
        # The default keeps the record of runs started before the option existed, so they can be rejoined.
        return (
            {"name": "WeightedMean"}
            if self.weights == "samples"
            else {"name": "WeightedMean", "weights": self.weights}
        )

    def weight(self, samples: int, steps: int) -> float:
        return sample_weight(samples, steps, self.weights)

    def merge(self, contributions: Iterable[tuple[Arrays, float]]) -> Arrays:
        return weighted_mean(contributions)


def weighted_mean(contributions: Iterable[tuple[Arrays, float]]) -> Arrays:
    """Σ w·Δ / Σ w over (Δ, w) pairs; raises ValueError if there are none or all weights are zero. In place
    on one running sum, with operators only: numpy arrays and torch tensors give the same float32 bits."""
    total: Arrays | None = None
    weight_sum = 0.0
    for delta, weight in contributions:
        if total is None:
            total = {name: zeros_like(values) for name, values in delta.items()}
        for name, values in delta.items():
            total[name] += float(weight) * values
        weight_sum += weight
        del delta  # let the contribution go before the next one is read
    if total is None or weight_sum <= 0:
        raise ValueError("weighted_mean needs at least one contribution with a positive weight")
    for values in total.values():
        values /= float(weight_sum)
    return total
