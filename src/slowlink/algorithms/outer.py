"""The outer optimizer: applies a merged pseudo-gradient Δ = θ_anchor − θ_local to the anchor.

Outer Nesterov (research/algorithms.md §0, PyTorch SGD(nesterov=True, dampening=0) semantics):
    b ← μ·b + Δ ;  θ ← θ_anchor − η·(Δ + μ·b)         (η = outer_lr, μ = outer_momentum)
With μ = 0 this is θ_anchor − η·Δ; with η = 1 as well it is plain parameter averaging.
Written with operators only, so numpy arrays and torch tensors (on any device) give the same float32 bits.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from ..arrays import Arrays, zeros_like


@dataclass(frozen=True)
class OuterState:
    """The Nesterov buffer b, one array per parameter, zero before the first round."""

    momentum: Arrays


class OuterOptimizer(NamedTuple):
    init: Callable[[Arrays], OuterState]
    update: Callable[..., tuple[Arrays, OuterState]]


def outer_nesterov(lr: float, momentum: float, *, nesterov: bool = True) -> OuterOptimizer:
    """Outer SGD with momentum; `nesterov=False` gives heavy-ball: θ ← θ_anchor − η·b."""
    # Python floats: numpy and torch both round them to the arrays' float32, as np.float32(x) would.
    mu, eta = float(momentum), float(lr)

    def init(params: Arrays) -> OuterState:
        return OuterState({name: zeros_like(values) for name, values in params.items()})

    def update(
        delta: Arrays, state: OuterState, anchor: Arrays, *, use_momentum: bool = True
    ) -> tuple[Arrays, OuterState]:
        """(θ, state') from Δ, the state and the anchor, all only read. A flush-only round applies Δ once
        and returns the state as it was."""
        if not use_momentum:
            return {name: anchor[name] - eta * step for name, step in delta.items()}, state
        buffers = {name: mu * state.momentum[name] + step for name, step in delta.items()}  # b ← μ·b + Δ
        directions = (
            {name: step + mu * buffers[name] for name, step in delta.items()} if nesterov else buffers
        )
        return {name: anchor[name] - eta * directions[name] for name in delta}, OuterState(buffers)

    return OuterOptimizer(init, update)
