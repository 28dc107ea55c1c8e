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
        params, buffers = {}, {}
        for name, step in delta.items():  # tensor by tensor: the only fragment-sized arrays are the results
            buffers[name] = buffer = mu * state.momentum[name] + step  # b ← μ·b + Δ
            params[name] = anchor[name] - eta * (step + mu * buffer if nesterov else buffer)
        return params, OuterState(buffers)

    return OuterOptimizer(init, update)


class RoundShape(NamedTuple):
    """What a merger knows of the round it commits: how many nodes it merged of the live ones, the mean
    steps its contributions span, and whether any of those steps were trained on a stale anchor (no
    barrier, and the round spans more than one sync: the steps trained while the last round was in
    flight, before its outer step was seen)."""

    contributors: int
    live: int
    stale: bool = False

    @property
    def share(self) -> float:
        """c: the share of the live nodes this round merged, in (0, 1]."""
        return min(1.0, self.contributors / max(1, self.live))


FULL_ROUND = RoundShape(contributors=1, live=1)


def outer_nesterov_by_share(lr: float, momentum: float, *, nesterov: bool = True) -> OuterOptimizer:
    """Outer Nesterov for rounds that merge a share c of the live nodes (docs/decoupled.md):
        b ← μ^c·b + c·Δ ;  θ ← θ_anchor − η·(c·Δ + c·μ·b)
    so 1/c rounds of share c move the model as one full round would; on a stale round the momentum push
    is left out, θ ← θ_anchor − c·Δ: its steps already ran on without the last push. A full round that is
    not stale (c = 1, every barrier round) is outer_nesterov exactly."""
    plain = outer_nesterov(lr, momentum, nesterov=nesterov)
    mu, eta = float(momentum), float(lr)

    def update(
        delta: Arrays, state: OuterState, anchor: Arrays, *, use_momentum: bool = True,
        shape: RoundShape = FULL_ROUND,
    ) -> tuple[Arrays, OuterState]:  # fmt: skip
        if shape.share == 1.0 and not shape.stale:
            return plain.update(delta, state, anchor, use_momentum=use_momentum)
        c = float(shape.share)
        if not use_momentum:
            return {name: anchor[name] - eta * c * step for name, step in delta.items()}, state
        decay = mu**c
        params, buffers = {}, {}
        for name, step in delta.items():  # tensor by tensor, as outer_nesterov
            buffers[name] = buffer = decay * state.momentum[name] + c * step
            if shape.stale:  # averaging by share: no push from a buffer these steps never saw
                params[name] = anchor[name] - c * step
            else:
                params[name] = anchor[name] - eta * (c * step + c * mu * buffer if nesterov else c * buffer)
        return params, OuterState(buffers)

    return OuterOptimizer(plain.init, update)
