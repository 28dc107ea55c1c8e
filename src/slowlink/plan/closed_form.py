"""Utilization in closed form: the timeline's steady state written out, and the research notes'
first-order formulas for comparison (research/algorithms.md §2.5; docs/planning.md).

`utilization`: each sync on its own, on a free link (u, d, release r_i, deadlines as in model.py):
    finish_i = (i+1)·d + max_{j ≤ i}(r_j − j·d)                   messages i = 0.. in release order
    E_p      = max(0, max_i(finish_i − (backward + τ·T_c + ℓ_i·u)))   stall that sync p causes
    CU       = H·T_c / max(H·T_c + Σ_p E_p,  L·d + (H − P·s)·T_c)  the link's own capacity bound
It equals the timeline whenever syncs cannot queue behind each other: DP, DiLoCo, GlobalM1, and
Streaming with τ < s (the paper's and torchft's rule τ < H/P); tests check that. With τ ≥ s it ignores
the queue between fragments and is pessimistic.

`first_order`: no layers; T = T_AR of the whole payload; ⅔·T_c of backward to hide it behind:
    DP  T_c/(T_c + max(0, T − ⅔T_c))    DiLoCo  H·T_c/(H·T_c + T)
    Streaming  H·T_c/(H·T_c + P·max(0, T/P − τ·T_c))    GlobalM1  H·T_c/max(H·T_c, T)
"""

import numpy as np

from .model import Cluster, LayerTimes, Method, layer_times


def utilization(cluster: Cluster, method: Method, bandwidth: float) -> float:
    """Steady-state compute utilization at `bandwidth` bits/s, from the formula above."""
    times = layer_times(cluster, method, bandwidth)
    groups = method.groups(cluster.layers)
    period = method.sync_every * cluster.step_time
    stall = sum(_stall(times, layers, method.overlap_steps * cluster.step_time) for layers in groups)
    idle_steps = method.sync_every - method.fragments * method.step_spacing
    capacity = cluster.layers * times.message + idle_steps * cluster.step_time
    return min(1.0, period / max(period + stall, capacity))


def _stall(times: LayerTimes, layers: np.ndarray, overlap: float) -> float:
    """How long the forward waits for one fragment sent at a step whose backward starts at 0."""
    d = times.message
    order = np.arange(len(layers))
    finish = (order + 1) * d + np.maximum.accumulate(times.release[layers] - order * d)
    deadline = times.backward + overlap + times.start[layers]
    return max(0.0, float(np.max(finish - deadline)))


def first_order(cluster: Cluster, method: Method, bandwidth: float) -> float:
    """The research notes' one-line estimate; no per-layer overlap, so pessimistic at high CU."""
    compute = cluster.step_time
    hops = 2 * (cluster.workers - 1) * cluster.latency
    total = hops + cluster.ring_factor * method.bits * cluster.params / bandwidth
    period = method.sync_every * compute
    if method.sync_every == 1:  # data-parallel: hidden behind the backward pass
        return compute / (compute + max(0.0, total - 2 * compute / 3))
    if method.overlap_steps >= method.sync_every:  # GlobalM1: a whole round to hide it
        return min(1.0, period / total)
    if method.fragments == 1 and method.overlap_steps == 0:
        return period / (period + total)
    share = hops + (total - hops) / method.fragments
    exposed = max(0.0, share - method.overlap_steps * compute)
    return period / (period + method.fragments * exposed)
