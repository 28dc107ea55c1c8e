"""Robust merge rules and an outlier test, for runs where some nodes may send bad contributions.

TrimmedMean bounds what any one node can do to each coordinate; NormClippedMean bounds the size of each
node's Δ against the round's median. norm_outliers names the contributions to reject before merging.
Both rules must see the whole round before they can merge: they hold every contribution (see each rule).
"""

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..arrays import Arrays, float64_empty
from ..errors import ConfigError

CHUNK_VALUES = 1 << 22  # values stacked at once by TrimmedMean: 16 MiB of float32, whatever the round
NORM_CHUNK = 1 << 20  # values widened to float64 at once by l2_norm: 8 MiB
OUTLIER_MIN_CONTRIBUTIONS = 3  # below this, "the median of the others" is one node's word against another


@dataclass(frozen=True, kw_only=True)
class TrimmedMean:
    """Coordinate-wise trimmed mean (Yin et al., ICML 2018): of the n accepted Δ_m, each coordinate drops
    its k = ⌊trim·n⌋ largest and k smallest values and averages the n − 2k others, unweighted:
        Δ[i] = 1/(n−2k) · Σ_{r=k}^{n−k−1} sort_m(Δ_m[i])_r
    Each node counts once (weight() is 1 whatever its samples): reported samples are the node's own claim,
    and a weight would let one node buy the influence the trim takes away. With k ≥ 1 a node, however
    large its Δ, moves each coordinate at most to the range of the others' values. With n < 1/trim
    (fewer than 5 at trim=0.2) k is 0: the result is the exact unweighted mean, and protects nothing.

    Memory: the merger's iterator yields one contribution at a time, but a coordinate's rank needs all n,
    so every contribution of the round is held (n × fragment, as the payloads' read-only views), plus one
    float32 result and a working block of at most CHUNK_VALUES values, stacked and sorted chunk by chunk.
    """

    trim: float = 0.2

    def __post_init__(self) -> None:
        _require_number("trim", self.trim, 0.0, 0.5, upper_open=True,
                        hint="the share dropped at each end; 0.2 drops 1 of 5, 0 is the plain mean")  # fmt: skip

    def to_dict(self) -> dict:
        return {"name": "TrimmedMean", "trim": float(self.trim)}

    def weight(self, samples: int, steps: int) -> float:
        del samples, steps  # every node counts once: see the class docstring
        return 1.0

    def trimmed(self, count: int) -> int:
        """k: the values dropped at each end of each coordinate when `count` contributions merge."""
        # The epsilon keeps 0.29·100 = 28.999… at 29; k < count/2 always leaves one value.
        return min(math.floor(self.trim * count + 1e-9), (count - 1) // 2)

    def merge(self, contributions: Iterable[tuple[Arrays, float]]) -> Arrays:
        # A weight ≤ 0 counts nothing in WeightedMean; here it leaves the contribution out.
        held = [delta for delta, weight in contributions if weight > 0]
        if not held:
            raise ValueError("TrimmedMean needs at least one contribution with a positive weight")
        _check_same_tensors(held)
        count = len(held)
        k = self.trimmed(count)
        width = max(1, CHUNK_VALUES // count)
        merged: Arrays = {}
        for name, first in held[0].items():
            out = np.empty(first.size, np.float32)
            rows = [delta[name].reshape(-1) for delta in held]  # views, no copy
            for start in range(0, first.size, width):
                stop = min(start + width, first.size)
                block = np.empty((count, stop - start), np.float32)  # (n, chunk)
                for row, values in enumerate(rows):
                    block[row] = values[start:stop]
                if k:
                    block.sort(axis=0)  # faster than np.partition for the small n of a round
                out[start:stop] = block[k : count - k].sum(axis=0, dtype=np.float64) / (count - 2 * k)
            merged[name] = out.reshape(first.shape)
        return merged


@dataclass(frozen=True, kw_only=True)
class NormClippedMean:
    """Weighted mean of norm-clipped contributions: each Δ_m is scaled down to at most c·med, where
    c = `clip` and med is the lower median of the round's norms ‖Δ_m‖₂, then averaged by samples w_m:
        Δ = Σ_m w_m·min(1, c·med/‖Δ_m‖)·Δ_m / Σ_m w_m
    (norm bounding as in Sun et al. 2019, relative to the round rather than fixed). Every clipped Δ_m has
    norm ≤ c·med, so ‖Δ‖ ≤ c·med too, and med is at most the largest honest norm whenever one node is
    bad. The lower median (the smaller middle norm when n is even) keeps a huge Δ from raising its own
    cap: of two contributions, the larger is clipped to c × the smaller. A zero median zeroes the rest.
    A node can still lean on the direction through its reported samples; TrimmedMean ignores them.

    Memory: med is known only once every norm is, and the iterator cannot be read twice, so the round's
    contributions are held (n × fragment, as the payloads' read-only views) plus one float32 sum.
    """

    clip: float = 2.0

    def __post_init__(self) -> None:
        _require_number("clip", self.clip, 1.0, None,
                        hint="the largest norm kept, in medians; 2.0 lets honest spread through")  # fmt: skip

    def to_dict(self) -> dict:
        return {"name": "NormClippedMean", "clip": float(self.clip)}

    def weight(self, samples: int, steps: int) -> float:
        del steps  # the samples already count every step's batch
        return float(samples)

    def merge(self, contributions: Iterable[tuple[Arrays, float]]) -> Arrays:
        held = [(delta, weight) for delta, weight in contributions if weight > 0]
        if not held:
            raise ValueError("NormClippedMean needs at least one contribution with a positive weight")
        _check_same_tensors([delta for delta, _ in held])
        norms = [l2_norm(delta) for delta, _ in held]
        cap = self.clip * statistics.median_low(norms)
        total = {name: np.zeros(values.shape, np.float32) for name, values in held[0][0].items()}
        weight_sum = 0.0
        for (delta, weight), norm in zip(held, norms, strict=True):
            scale = 1.0 if norm <= cap else cap / norm
            for name, values in delta.items():
                total[name] += np.float32(weight * scale) * values
            weight_sum += weight
        for values in total.values():
            values /= np.float32(weight_sum)
        return total


def norm_outliers(
    norms: Mapping[str, float],
    factor: float,
    history: Sequence[float] = (),
    steps: Mapping[str, int] | None = None,
) -> dict[str, str]:
    """The nodes whose ‖Δ‖ is too large, each mapped to the reason (norm, reference, factor) a merger
    records when it rejects it. Sorted by node.

    With at least two other contributions in the round, a norm above `factor` × their median is flagged.
    With fewer (one or two contributions: what quorum_size=1 gives whenever a node is late), a norm above
    `factor` × s_m × the largest of `history` is flagged: `history` holds the norms per step of the
    fragment's recently merged contributions (as the merger measured them), s_m the steps node m's Δ spans
    (`steps`, 1 if not given), so a node that carries the steps of missed rounds is not judged by one
    round's size. The other node's norm is no reference: of two nodes that disagree either may be the
    honest one (a node flushing a few steps has a small Δ). With no history, nothing is flagged by size;
    nor against a zero reference. A non-finite norm is always flagged, and left out of the references.
    """
    _require_number("factor", factor, 1.0, None, lower_open=True,
                    hint="how many medians a norm may reach; 10 catches blow-ups, not honest spread")  # fmt: skip
    for node, norm in norms.items():
        if norm < 0:
            raise ValueError(f"node {node!r} has a negative norm {norm}; norms are ‖Δ‖₂ ≥ 0")
    flagged: dict[str, str] = {}
    for node, norm in sorted(norms.items()):
        if not math.isfinite(norm):
            flagged[node] = f"its Δ's L2 norm is {norm}, not a finite number"
            continue
        others = [other for name, other in norms.items() if name != node and math.isfinite(other)]
        if len(others) >= OUTLIER_MIN_CONTRIBUTIONS - 1:
            against = f"the median norm of the round's {len(others)} other contributions"
            reason = _above(norm, factor, statistics.median(others), against)
        else:
            spans = 1 if steps is None else steps.get(node, 1)
            reason = beyond_history(norm, spans, history, factor)
        if reason is not None:
            flagged[node] = reason
    return flagged


def beyond_history(
    norm: float, steps: int, history: Sequence[float], factor: float, *, whose: str = "the fragment's"
) -> str | None:
    """Why a ‖Δ‖ spanning `steps` steps is too large for `history`, the norms per step of recently merged
    contributions (`whose` they are, for the reason): above factor × steps × max(history). None if it is
    within that, or if there is no finite history to judge it by. norm_outliers' rule with one or two
    contributions, and a node's own check before it publishes (protocol/courier.py)."""
    per_step = [value for value in history if math.isfinite(value)]
    if not per_step:
        return None
    against = f"{steps} step(s) at the largest norm per step of {whose} {len(per_step)} recently merged contributions"
    return _above(norm, factor, max(per_step) * steps, against)


def _above(norm: float, factor: float, reference: float, against: str) -> str | None:
    if reference > 0 and norm > factor * reference:
        return (f"its Δ's L2 norm {norm:.6g} is {norm / reference:.3g} times {reference:.6g}, {against}, "
                f"above the limit of {factor:g} times")  # fmt: skip
    return None


def bounded_claims(
    claims: Mapping[str, tuple[int, int]],
    history: Mapping[str, Sequence[float]],
    *,
    max_steps: int,
    ratio: float,
) -> dict[str, tuple[int, int]]:
    """The (samples, steps) each node's contribution is weighted by, bounded so that no node buys the round
    by what it reports about itself (claims: node -> its reported samples and steps):
        steps ≤ max_steps      (a merger allows many rounds' worth: carried steps count)
        samples/steps ≤ ratio·s_others and ≤ ratio·s_own
    with s_others the lower median of the round's other nodes' samples per step and s_own the median of
    the node's own recent ones (`history`). One node claiming 10¹² samples beside an honest node's 64 then
    counts for at most `ratio` times as much, not for the whole round; honest nodes of different batch
    sizes and speeds keep their weights within that ratio. With one contribution its weight is moot."""
    per_step = {node: samples / max(steps, 1) for node, (samples, steps) in claims.items()}
    bounded = {}
    for node, (samples, steps) in claims.items():
        steps = min(steps, max_steps)
        limits = [per_step[node]]
        if others := [value for name, value in per_step.items() if name != node]:
            limits.append(ratio * statistics.median_low(others))
        if history.get(node):
            limits.append(ratio * statistics.median(history[node]))
        bounded[node] = (min(samples, math.floor(min(limits) * steps)), steps)
    return bounded


def l2_norm(arrays: Mapping[str, np.ndarray]) -> float:
    """‖Δ‖₂ over every tensor of a dict, accumulated in float64, of numpy arrays or torch tensors (on their
    device, read back once). Contiguous arrays (as the wire decodes them) are read in place, widened to
    float64 NORM_CHUNK values at a time, never whole."""
    squares, buffer = 0.0, None
    for values in arrays.values():
        flat = values.reshape(-1)  # a view when contiguous
        if buffer is None:
            buffer = float64_empty(
                flat, min(NORM_CHUNK, max(v.reshape(-1).shape[0] for v in arrays.values()))
            )
        for start in range(0, flat.shape[0], NORM_CHUNK):
            chunk = buffer[: min(NORM_CHUNK, flat.shape[0] - start)]
            chunk[:] = flat[start : start + NORM_CHUNK]  # widened into the one buffer
            # Not a dot product: numpy's calls BLAS, whose idle threads spin and burn the training's cores.
            chunk *= chunk
            squares = squares + chunk.sum()  # a float64 scalar; on a device it stays there until the end
    return math.sqrt(float(squares))


def _check_same_tensors(deltas: list[Arrays]) -> None:
    """Every contribution must hold the first one's tensors with its shapes (the merger checks names)."""
    first = deltas[0]
    for index, delta in enumerate(deltas[1:], start=1):
        if delta.keys() != first.keys():
            raise ValueError(f"contribution {index} holds tensors {sorted(delta)}, not {sorted(first)}")
        for name, values in delta.items():
            if values.shape != first[name].shape:
                raise ValueError(f"contribution {index}'s tensor {name!r} has shape {values.shape}, "
                                 f"not {first[name].shape}")  # fmt: skip


def _require_number(
    name: str,
    value: object,
    low: float,
    high: float | None,
    *,
    lower_open: bool = False,
    upper_open: bool = False,
    hint: str,
) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if lower_open else value >= low) and (
            high is None or (value < high if upper_open else value <= high)
        )
    if not ok:
        lower = f"{'(' if lower_open else '['}{low}"
        valid = f"{lower}, {high}{')' if upper_open else ']'}" if high is not None else f"{lower}, ∞)"
        raise ConfigError(f"{name}={value!r} is invalid: it must be a number in {valid} ({hint})")
