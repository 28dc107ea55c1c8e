"""The outer optimizer: applies a merged pseudo-gradient Δ = θ_anchor − θ_local to the anchor.

Outer Nesterov (research/algorithms.md §0, PyTorch SGD(nesterov=True, dampening=0) semantics):
    b ← μ·b + Δ ;  θ ← θ_anchor − η·(Δ + μ·b)         (η = outer_lr, μ = outer_momentum)
With μ = 0 this is θ_anchor − η·Δ; with η = 1 as well it is plain parameter averaging.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..arrays import Arrays


@dataclass(frozen=True)
class OuterState:
    """The Nesterov buffer b, one array per parameter, zero before the first round."""

    momentum: Arrays


class OuterOptimizer(NamedTuple):
    init: Callable[[Arrays], OuterState]
    update: Callable[..., tuple[Arrays, OuterState]]


def outer_nesterov(lr: float, momentum: float, *, nesterov: bool = True) -> OuterOptimizer:
    """Outer SGD with momentum; `nesterov=False` gives heavy-ball: θ ← θ_anchor − η·b."""

    def init(params: Arrays) -> OuterState:
        return OuterState({name: np.zeros_like(values, dtype=np.float32) for name, values in params.items()})

    def update(
        delta: Arrays, state: OuterState, anchor: Arrays, *, use_momentum: bool = True
    ) -> tuple[Arrays, OuterState]:
        """(θ, state') from Δ, the state and the anchor. Δ and the state are consumed: θ is computed in Δ's
        buffers and the momentum updated in place, so a merger holds one fragment for Δ and θ together and
        one momentum buffer. The anchor is only read."""
        for name, step in delta.items():
            if use_momentum:  # a flush-only round applies Δ once and leaves the buffer as it was
                buffer = state.momentum[name]
                buffer *= np.float32(momentum)
                buffer += step  # b ← μ·b + Δ
                if nesterov:
                    step += np.float32(momentum) * buffer  # Δ + μ·b
                else:
                    step[...] = buffer
            step *= np.float32(-lr)
            step += anchor[name]  # θ = θ_anchor − η·(direction)
        return delta, state

    return OuterOptimizer(init, update)
