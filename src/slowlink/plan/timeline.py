"""The per-layer timeline: an event simulation of the training DAG that the Streaming DiLoCo paper
simulates (research/algorithms.md §2.5), run until its utilization repeats from one round to the next.

Per step: F_1..F_L, then Ba_ℓ and Bw_ℓ from ℓ = L down (no Ba_1), each node u = T_c/(3L − 1) on one
compute resource, in the only order their data allows. A sync sends one message per layer of the due
fragment, released when Bw_ℓ ends, onto one FIFO link (d seconds each, model.py). F_ℓ of step
t + 1 + τ waits for layer ℓ's message of step t. Per step, with c the end of the last backward:
    start(F_ℓ) = ℓ·u + max(c, max_{j ≤ ℓ}(ready_j − j·u))          (forward with waits)
    finish_i   = (i+1)·d + max(link_free, max_{j ≤ i}(release_j − j·d))   (FIFO link, in release order)
CU = H·T_c / (duration of one round of H steps), once two rounds in a row take the same time and
leave the same backlog on the link.
"""

import math

import numpy as np

from .model import Cluster, LayerTimes, Method, layer_times

MAX_STEPS = 200_000  # bounds on the simulation; a round of H steps repeats long before either
MAX_ROUNDS = 2_000
SETTLED = 1e-9  # relative change in a round's duration below which the timeline repeats


class _Run:
    """The mutable state of one simulation: the clock, the link, and what each future step awaits."""

    def __init__(self, times: LayerTimes, method: Method, groups: list[np.ndarray]) -> None:
        self.times, self.method, self.groups = times, method, groups
        self.step_time = times.forward + times.backward
        self.clock = 0.0  # end of the last step's backward
        self.link_free = 0.0
        self.ready: dict[int, np.ndarray] = {}  # step -> per layer, when its parameters are in
        self.due = {offset: p for p, offset in enumerate(method.offsets())}  # step mod H -> fragment

    def round(self, first: int, end: int) -> None:
        """Steps first..end-1; a step that sends nothing and waits for nothing just takes T_c."""
        sends = [first + offset for offset in sorted(self.due)]
        k = first
        while True:
            waits = [step for step in self.ready if step < end]
            events = [step for step in sends if step >= k] + waits
            if not events:
                break
            event = min(events)
            self.clock += (event - k) * self.step_time
            self.step(event)
            k = event + 1
        self.clock += (end - k) * self.step_time

    def step(self, k: int) -> None:
        times = self.times
        ready = self.ready.pop(k, None)
        forward_start = self.clock
        if ready is not None:  # wait, mid-forward, for layers whose parameters have not landed
            forward_start = max(forward_start, float(np.max(ready - times.start)))
        backward_start = forward_start + times.forward
        fragment = self.due.get(k % self.method.sync_every)
        if fragment is not None:
            self._send(k, self.groups[fragment], backward_start)
        self.clock = backward_start + times.backward

    def _send(self, k: int, layers: np.ndarray, backward_start: float) -> None:
        d = self.times.message
        order = np.arange(len(layers))
        released = backward_start + self.times.release[layers]
        finish = (order + 1) * d + np.maximum(self.link_free, np.maximum.accumulate(released - order * d))
        self.link_free = float(finish[-1])
        slot = self.ready.setdefault(
            k + 1 + self.method.overlap_steps, np.full(len(self.times.release), -math.inf)
        )
        slot[layers] = np.maximum(slot[layers], finish)


def utilization(cluster: Cluster, method: Method, bandwidth: float) -> float:
    """Steady-state compute utilization, compute / (compute + waiting), at `bandwidth` bits/s."""
    run = _Run(layer_times(cluster, method, bandwidth), method, method.groups(cluster.layers))
    period = method.sync_every
    rounds: list[tuple[float, float]] = []  # (duration, link backlog at the round's end)
    for r in range(max(4, min(MAX_ROUNDS, MAX_STEPS // period))):
        begin = run.clock
        run.round(r * period, (r + 1) * period)
        rounds.append((run.clock - begin, max(0.0, run.link_free - run.clock)))
        # Settled once a round repeats and the link's backlog has stopped growing: a backlog can grow
        # for rounds before anything waits, when τ leaves slack.
        if len(rounds) >= 4 and _same(rounds[-1], rounds[-2], scale=rounds[-1][0]):
            return min(1.0, period * cluster.step_time / rounds[-1][0])
    # No exact repeat (a cycle longer than one round): average the second half of the rounds.
    tail = [duration for duration, _ in rounds[len(rounds) // 2 :]]
    return min(1.0, period * cluster.step_time * len(tail) / sum(tail))


def _same(a: tuple[float, float], b: tuple[float, float], scale: float) -> bool:
    return all(abs(x - y) <= SETTLED * scale for x, y in zip(a, b, strict=True))


def trace(cluster: Cluster, method: Method, bandwidth: float, steps: int) -> list[tuple[float, float]]:
    """(forward start, backward end) of each of the first `steps` steps: for tests and pictures."""
    times = layer_times(cluster, method, bandwidth)
    run = _Run(times, method, method.groups(cluster.layers))
    spans = []
    for k in range(steps):
        ready = run.ready.get(k)
        start = run.clock if ready is None else max(run.clock, float(np.max(ready - times.start)))
        run.step(k)
        spans.append((start, run.clock))
    return spans
