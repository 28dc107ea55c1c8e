"""The bandwidth a method needs for a target utilization: bisection on log W over one of the models.

CU(W) never falls as W grows (every message only gets shorter), so the answer is the smallest W with
CU(W) ≥ target, found to 1e-6 relative. A target that latency alone forbids (CU at W = ∞ still below
it), or that only W = ∞ reaches (100% for DP), has no answer: None.
"""

import math
from collections.abc import Callable

from ..errors import ConfigError
from . import closed_form, timeline
from .model import Cluster, Method

Model = Callable[[Cluster, Method, float], float]
MODELS: dict[str, Model] = {
    "timeline": timeline.utilization,
    "closed-form": closed_form.utilization,
    "first-order": closed_form.first_order,
}
RELATIVE_TOLERANCE = 1e-6


def model_named(name: str) -> Model:
    if name not in MODELS:
        raise ConfigError(f"--model {name!r} is not a model; use one of {', '.join(MODELS)}")
    return MODELS[name]


def bandwidth_for(
    target: float, cluster: Cluster, method: Method, model: Model = timeline.utilization
) -> float | None:
    """The least bandwidth in bits/s at which `model` gives utilization ≥ target; None if none does."""
    if not 0 < target <= 1:
        raise ConfigError(f"target utilization {target} must be in (0, 1]")
    if model(cluster, method, math.inf) < target:
        return None
    # One full exchange per step of compute: the scale of every answer.
    scale = cluster.ring_factor * method.bits * cluster.params / cluster.step_time
    low, high = scale * 1e-9, scale * 1e3
    while model(cluster, method, high) < target:
        high *= 1e3
        if high > scale * 1e30:  # reached only in the limit (e.g. 100% for DP): no finite answer
            return None
    while model(cluster, method, low) >= target:
        low /= 1e3
    while high / low > 1 + RELATIVE_TOLERANCE:
        middle = math.sqrt(low * high)
        if model(cluster, method, middle) >= target:
            high = middle
        else:
            low = middle
    return high
