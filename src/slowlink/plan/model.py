"""What the planner models: a cluster (a model of N parameters in L equal layers, a compute time per
step, M workers, one link each) and a method (which layers sync, how often, how late they may land).

Both models (timeline.py, closed_form.py) read the per-layer times defined here
(research/algorithms.md §0 and §2.5; docs/planning.md gives each assumption):
    u   = T_c / (3L − 1)                  one compute node; a step is F_1..F_L, then Ba_ℓ, Bw_ℓ from
                                          ℓ = L down to 1 with no Ba_1: 3L − 1 nodes, 4L − 1 with R_ℓ
    d   = 2(M−1)·λ + 2(M−1)/M · b·N/L / W one layer's ring all-reduce (latency λ a hop, W bits/s)
    release of layer ℓ's message: the end of Bw_ℓ, 2(L−ℓ+1)·u into the backward (ℓ ≥ 2), (2L−1)·u (ℓ = 1)
    deadline: the start of F_ℓ in step t + 1 + τ, (ℓ − 1)·u into that step's forward
Layers are 0-based in code: layer 0 is the one next to the input.
"""

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

# Bits per value on the wire: slowlink's encodings (wire/encodings.py): F4 is OCP MXFP4, 4 bits plus
# one scale byte per 32 values; F8_E4M3 likewise 8 + 8/32. The paper's FP4 (E3M0) is 4 bits flat.
ENCODING_BITS = {"F32": 32.0, "BF16": 16.0, "F8_E4M3": 8.25, "F4": 4.25}


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """params (N), layers (L, equal in size), step_time (T_c, compute seconds per step, no waiting),
    workers (M, each behind one full-duplex link), latency (λ, seconds per message hop)."""

    params: float
    layers: int
    step_time: float
    workers: int
    latency: float = 0.0

    def __post_init__(self) -> None:
        _check(self.params > 0 and math.isfinite(self.params), f"--params {self.params} must be positive")
        _check(self.layers >= 1, f"--layers {self.layers} must be at least 1")
        _check(self.step_time > 0, f"--step-time {self.step_time} must be positive seconds, e.g. 2.4")
        _check(self.workers >= 2, f"--workers {self.workers} must be at least 2: one worker sends nothing")
        _check(self.latency >= 0, f"--latency {self.latency} must be at least 0 seconds")

    @property
    def ring_factor(self) -> float:
        """Bytes each worker sends per byte reduced, in a ring all-reduce: 2(M−1)/M."""
        return 2 * (self.workers - 1) / self.workers


@dataclass(frozen=True, kw_only=True)
class Method:
    """A sync pattern. Every `sync_every` (H) steps each of `fragments` (P) strided groups of layers
    (layer ℓ in group ℓ mod P) is all-reduced once, group p at step offsets p·spacing; a group sent
    at step t must land before step t + 1 + overlap_steps (τ) starts. DP is H = 1; DiLoCo P = 1, τ = 0;
    Streaming DiLoCo P > 1; GlobalM1 (FGDiLoCo) P = 1, τ = H: the parameters mix during a whole round."""

    name: str
    label: str
    sync_every: int = 1
    fragments: int = 1
    overlap_steps: int = 0
    encoding: str = "BF16"
    bits: float = 16.0
    spacing: int | None = None  # steps between fragment syncs; None is ⌊H/P⌋, slowlink's schedule

    def __post_init__(self) -> None:
        _check(self.sync_every >= 1, f"--sync-every {self.sync_every} must be at least 1")
        _check(
            1 <= self.fragments <= self.sync_every,
            f"--fragments {self.fragments} must be between 1 and --sync-every {self.sync_every}",
        )
        _check(self.overlap_steps >= 0, f"--overlap-steps {self.overlap_steps} must be at least 0")
        _check(self.bits > 0, f"{self.name}: bits per value {self.bits} must be positive")
        step, p, h = self.step_spacing, self.fragments, self.sync_every
        _check(
            step >= 1 and (p - 1) * step < h,
            f"spacing {step} with {p} fragments does not fit in H = {h}: (P − 1)·spacing must be below H",
        )

    @property
    def step_spacing(self) -> int:
        return self.spacing if self.spacing is not None else max(1, self.sync_every // self.fragments)

    def offsets(self) -> list[int]:
        """The step (mod H) at which each fragment is sent."""
        return [p * self.step_spacing for p in range(self.fragments)]

    def groups(self, layers: int) -> list[np.ndarray]:
        """Each fragment's layers in the order their messages are released: the top layer first."""
        if self.fragments > layers:
            raise ConfigError(
                f"--fragments {self.fragments} exceeds the model's {layers} layers; use at most {layers} "
                "(or give --layers)"
            )
        return [np.arange(layers)[p :: self.fragments][::-1].copy() for p in range(self.fragments)]


@dataclass(frozen=True)
class LayerTimes:
    """Per-layer times of one cluster, method and bandwidth (seconds; see the module docstring)."""

    node: float  # u
    message: float  # d
    release: np.ndarray  # [L], from the start of the backward
    start: np.ndarray  # [L], start of F_ℓ from the start of the forward, if nothing waits

    @property
    def forward(self) -> float:
        return len(self.release) * self.node

    @property
    def backward(self) -> float:
        return (2 * len(self.release) - 1) * self.node


def layer_times(cluster: Cluster, method: Method, bandwidth: float) -> LayerTimes:
    """u, d and the release and start offsets; bandwidth in bits/s, math.inf for latency alone."""
    if not bandwidth > 0:
        raise ConfigError(f"--bandwidth {bandwidth} must be positive bits per second, e.g. 100Mbps")
    layers = cluster.layers
    node = cluster.step_time / (3 * layers - 1)
    bits = cluster.ring_factor * method.bits * cluster.params / layers
    message = 2 * (cluster.workers - 1) * cluster.latency + bits / bandwidth
    index = np.arange(layers)
    release = 2.0 * (layers - index) * node
    release[0] = (2 * layers - 1) * node  # no Ba_1: Bw_1 ends the step
    return LayerTimes(node=node, message=message, release=release, start=index * node)


def layers_for(params: float) -> int:
    """Depth of a transformer of `params` parameters with d_model ≈ 85 × layers and 12·L·d² weights, the
    shape of the Streaming DiLoCo paper's 1B/10B/100B models (24/48/108 layers; this gives 23/49/105)."""
    return max(1, round((params / (12 * 85.0**2)) ** (1 / 3)))


def step_time_from_flops(
    params: float, batch_tokens: float, chips: float, peak_flops: float, mfu: float
) -> float:
    """T_c = 6·N·tokens / (chips · peak FLOP/s · MFU): the Kaplan count of training FLOPs per step."""
    _check(chips > 0, f"--chips {chips} must be positive")
    _check(peak_flops > 0, f"--peak-flops {peak_flops} must be positive FLOP/s, e.g. 989e12")
    _check(0 < mfu <= 1, f"--mfu {mfu} must be in (0, 1], e.g. 0.4")
    return 6.0 * params * batch_tokens / (chips * peak_flops * mfu)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
