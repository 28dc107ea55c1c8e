"""Outer momentum that backs off when a round's Δ opposes it (docs/decoupled.md, "Opposed momentum"):
without a barrier, steps trained while a round was in flight carry an outer step's overshoot into the next
contributions, and a momentum buffer that keeps pushing against them oscillates."""

from ..arrays import Arrays


def damp_opposed(delta: Arrays, momentum: Arrays) -> Arrays:
    """The buffer b scaled by (1 + cos)² where cos = ⟨Δ, b⟩ / (‖Δ‖·‖b‖) < 0 over the whole fragment, so a
    buffer that points against the round's merged Δ loses the share of it that the round contradicts (all
    of it when Δ points straight back); otherwise b itself. Operators only: numpy and torch alike."""
    if not momentum:
        return momentum
    inner = sum(float((delta[name] * values).sum()) for name, values in momentum.items())
    if inner >= 0:
        return momentum
    delta_sq = sum(float((values * values).sum()) for values in delta.values())
    buffer_sq = sum(float((values * values).sum()) for values in momentum.values())
    cosine = max(-1.0, inner / (delta_sq * buffer_sq) ** 0.5)
    factor = (1.0 + cosine) ** 2
    return {name: values * factor for name, values in momentum.items()}
