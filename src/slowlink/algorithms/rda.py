"""Radial-directional averaging (Decoupled DiLoCo, research/algorithms.md §3, step 6): per tensor, the
merged Δ takes the mean length of the contributions and the direction of their mean direction, so that
nearly orthogonal Δs do not shrink like 1/√M as a plain mean makes them (and the outer lr keeps its meaning).
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..arrays import Arrays, zeros_like
from ..errors import ConfigError
from .merge import WEIGHTS, sample_weight
from .robust import l2_norm


@dataclass(frozen=True, kw_only=True)
class RDA:
    """Per tensor, with w_m the contributions' weights and φ(x) = x/‖x‖₂ (φ(0) = 0):

        Δ = (Σ w_m‖Δ_m‖ / Σ w_m) · φ(Σ w_m φ(Δ_m) / Σ w_m)

    The radial factor is the weighted mean of the norms (the paper's printed form, a mean of vectors, is
    dimensionally wrong; the notes follow the implementers who use norms). With one contribution it is that
    contribution; with identical ones, it is the mean.
    plain: a regular expression; tensors whose name it matches (re.search) take the plain weighted mean
        instead, as the paper does for the embedding fragment. None: every tensor is merged radially.
    weights: "samples" (each contribution weighs the samples it trained) or "quality" (samples × samples
        per step, the paper's c_tokens²/c_steps: with equal batches it equals "samples").
    Streams: one running direction and one radial sum per tensor, one contribution held at a time.
    """

    plain: str | None = None
    weights: str = "samples"

    def __post_init__(self) -> None:
        if self.weights not in WEIGHTS:
            raise ConfigError(f"RDA(weights={self.weights!r}): choose one of {', '.join(map(repr, WEIGHTS))}")
        if self.plain is not None:
            try:
                re.compile(self.plain)
            except (re.error, TypeError) as error:
                raise ConfigError(
                    f"RDA(plain={self.plain!r}) is not a regular expression ({error}); e.g. plain='embed'"
                ) from None

    def to_dict(self) -> dict:
        return {"name": "RDA", "plain": self.plain, "weights": self.weights}

    def weight(self, samples: int, steps: int) -> float:
        return sample_weight(samples, steps, self.weights)

    def merge(self, contributions: Iterable[tuple[Arrays, float]]) -> Arrays:
        pattern = re.compile(self.plain) if self.plain is not None else None
        direction: Arrays | None = None  # Σ w·φ(Δ_m) per radial tensor, Σ w·Δ_m per plain one
        radius: dict[str, float] = {}
        weight_sum = 0.0
        for delta, weight in contributions:
            if weight <= 0:
                continue  # counts nothing, as in the weighted mean
            if direction is None:
                direction = {name: zeros_like(values) for name, values in delta.items()}
                radius = dict.fromkeys(delta, 0.0)
            for name, values in delta.items():
                if pattern is not None and pattern.search(name):
                    direction[name] += float(weight) * values
                    continue
                norm = l2_norm({name: values})
                if norm != 0:  # φ(0) = 0; a NaN norm goes on, so the merger sees a result that is not finite
                    direction[name] += float(weight / norm) * values
                    radius[name] += weight * norm
            weight_sum += weight
            del delta
        if direction is None or weight_sum <= 0:
            raise ValueError("RDA needs at least one contribution with a positive weight")
        for name, values in direction.items():
            if pattern is not None and pattern.search(name):
                values /= float(weight_sum)
                continue
            length = l2_norm({name: values})  # ‖Σ w φ(Δ_m)‖: the 1/Σw of the mean cancels in φ
            scale = radius[name] / weight_sum / length if length != 0 else 0.0
            values *= float(scale)
        return direction
