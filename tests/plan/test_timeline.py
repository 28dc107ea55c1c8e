"""The per-layer timeline and its closed form, pinned to cases worked by hand and to each other."""

import math

import numpy as np
import pytest

from slowlink.errors import ConfigError
from slowlink.plan import closed_form, timeline
from slowlink.plan.model import Cluster, Method, layer_times
from slowlink.plan.search import bandwidth_for

# Two layers, T_c = 5 s: u = T_c/(3L − 1) = 1 s. A step is F_0 [0,1], F_1 [1,2], Ba_1 [2,3], Bw_1 [3,4],
# Bw_0 [4,5]. M = 2 (ring factor 1), 16 bits: a layer of 3/2 parameters is 24 bits, so at 8 bit/s a
# layer's message takes d = 3 s, and at 24 bit/s d = 1 s.
TINY = Cluster(params=3, layers=2, step_time=5.0, workers=2)
DP = Method(name="dp", label="DP")


def test_the_per_layer_times_follow_the_docstring():
    times = layer_times(TINY, DP, 8.0)
    assert times.node == 1.0 and times.message == 3.0
    assert list(times.release) == [3.0, 2.0]  # Bw_0 ends 3 s into the backward, Bw_1 after 2 s
    assert list(times.start) == [0.0, 1.0] and times.forward + times.backward == 5.0


def test_data_parallel_waits_for_the_first_layer_whose_message_is_sent_last():
    # Step 0: R_1 on the link [4,7], R_0 [7,10]. Step 1's F_0 needs R_0: it starts at 10, and so on.
    assert timeline.trace(TINY, DP, 8.0, steps=3) == [(0.0, 5.0), (10.0, 15.0), (20.0, 25.0)]
    assert timeline.utilization(TINY, DP, 8.0) == pytest.approx(0.5)
    # d = 1: R_1 [4,5], R_0 [5,6]; only the last message is exposed, 1 s a step: CU = 5/6.
    assert timeline.utilization(TINY, DP, 24.0) == pytest.approx(5 / 6)


def test_diloco_exposes_its_round_once_every_h_steps():
    # H = 3, d = 3: step 0 sends, step 1 waits until 10; each round is 15 s of compute in 20 s.
    diloco = Method(name="diloco", label="DiLoCo", sync_every=3)
    spans = timeline.trace(TINY, diloco, 8.0, steps=5)
    assert spans == [(0.0, 5.0), (10.0, 15.0), (15.0, 20.0), (20.0, 25.0), (30.0, 35.0)]
    assert timeline.utilization(TINY, diloco, 8.0) == pytest.approx(0.75)


def test_a_streamed_fragment_is_needed_only_when_the_forward_reaches_its_layer():
    # H = 4, two fragments: layer 0 sent at step 0, layer 1 at step 2 (s = 2). Layer 0's message,
    # released 3 s into the backward, lands 3 s after the next forward would start: a 3 s wait. Layer 1's,
    # released at 2 s, lands at 5 s, but F_1 starts 1 s into the forward (4 s): a 1 s wait only.
    streaming = Method(name="streaming", label="Streaming", sync_every=4, fragments=2)
    spans = timeline.trace(TINY, streaming, 8.0, steps=5)
    assert spans == [(0.0, 5.0), (8.0, 13.0), (13.0, 18.0), (19.0, 24.0), (24.0, 29.0)]
    assert timeline.utilization(TINY, streaming, 8.0) == pytest.approx(20 / 24)
    assert closed_form.utilization(TINY, streaming, 8.0) == pytest.approx(20 / 24)


def test_latency_is_paid_per_hop_of_each_layers_ring():
    # λ = 0.5 s, M = 2: 2(M−1)λ = 1 s per message even at infinite bandwidth, as d = 1 above.
    slow = Cluster(params=3, layers=2, step_time=5.0, workers=2, latency=0.5)
    assert timeline.utilization(slow, DP, math.inf) == pytest.approx(5 / 6)
    assert bandwidth_for(0.9, slow, DP) is None  # latency alone holds DP at 83%
    assert timeline.utilization(TINY, DP, math.inf) == 1.0


def test_globalm1_hides_a_whole_round_and_then_is_bound_by_the_link():
    # 1.5B parameters, M = 8, bf16: T_AR = 1.75·24e9 bits / W; a round of H = 100 is 240 s of compute.
    cluster = Cluster(params=1.5e9, layers=26, step_time=2.4, workers=8)
    globalm1 = Method(name="globalm1", label="GlobalM1", sync_every=100, overlap_steps=100)
    assert timeline.utilization(cluster, globalm1, 200e6) == 1.0  # 210 s fits in 240 s
    assert timeline.utilization(cluster, globalm1, 100e6) == pytest.approx(240 / 420)


def _random_case(rng: np.random.Generator, overlap_beyond_spacing: bool):
    layers = int(rng.integers(3, 40))
    fragments = int(rng.integers(2, layers + 1))
    h = int(rng.integers(2 * fragments, 160))
    spacing = h // fragments
    tau = int(rng.integers(spacing, h)) if overlap_beyond_spacing else int(rng.integers(0, spacing))
    cluster = Cluster(
        params=float(10 ** rng.uniform(8, 11)), layers=layers, step_time=float(rng.uniform(0.05, 5)),
        workers=int(rng.integers(2, 16)), latency=float(rng.choice([0.0, 0.02])),
    )  # fmt: skip
    method = Method(name="streaming", label="S", sync_every=h, fragments=fragments, overlap_steps=tau)
    # a bandwidth at which one round's exchange takes 0.03 to 5 rounds of compute
    exchange = cluster.ring_factor * 16 * cluster.params
    bandwidth = exchange / (h * cluster.step_time * float(10 ** rng.uniform(-1.5, 0.7)))
    return cluster, method, bandwidth


def test_the_closed_form_equals_the_timeline_when_fragments_cannot_queue():
    rng = np.random.default_rng(7)
    for _ in range(60):
        cluster, method, bandwidth = _random_case(rng, overlap_beyond_spacing=False)
        assert closed_form.utilization(cluster, method, bandwidth) == pytest.approx(
            timeline.utilization(cluster, method, bandwidth), abs=1e-9
        ), (cluster, method, bandwidth)


def test_with_overlap_beyond_the_spacing_the_closed_form_is_pessimistic():
    rng = np.random.default_rng(8)
    gaps = []
    for _ in range(40):
        cluster, method, bandwidth = _random_case(rng, overlap_beyond_spacing=True)
        gap = timeline.utilization(cluster, method, bandwidth) - closed_form.utilization(
            cluster, method, bandwidth
        )
        assert gap >= -1e-9, (cluster, method, bandwidth)
        gaps.append(gap)
    assert max(gaps) > 0.02  # the queue between fragments is real, and only the timeline sees it


def test_a_backlog_that_grows_before_anything_waits_is_not_taken_for_a_steady_state():
    # τ = 153 of H = 197 leaves rounds of slack: with the link 5% over one round's worth, the first
    # rounds wait for nothing while the backlog grows; the steady state is link-bound at 1/1.05.
    cluster = Cluster(params=1e9, layers=18, step_time=3.59, workers=12)
    method = Method(name="streaming", label="S", sync_every=197, fragments=5, overlap_steps=153)
    bandwidth = cluster.ring_factor * 16 * cluster.params / (197 * 3.59) / 1.05
    assert timeline.utilization(cluster, method, bandwidth) == pytest.approx(1 / 1.05, rel=1e-6)


@pytest.mark.parametrize("name", ["dp", "diloco", "streaming", "globalm1"])
def test_utilization_never_falls_as_bandwidth_grows(name):
    cluster = Cluster(params=1e9, layers=24, step_time=0.1, workers=4)
    method = {
        "dp": DP,
        "diloco": Method(name="diloco", label="D", sync_every=50),
        "streaming": Method(name="streaming", label="S", sync_every=50, fragments=8, overlap_steps=2),
        "globalm1": Method(name="globalm1", label="G", sync_every=50, overlap_steps=50),
    }[name]
    values = [timeline.utilization(cluster, method, w) for w in np.logspace(8, 12.5, 60)]
    assert all(b >= a - 1e-12 for a, b in zip(values, values[1:], strict=False))
    assert values[0] < 0.5 < values[-1] <= 1.0


def test_bandwidth_for_finds_the_least_bandwidth_that_reaches_the_target():
    cluster = Cluster(params=1e9, layers=24, step_time=0.1, workers=2)
    method = Method(name="diloco", label="D", sync_every=100)
    needed = bandwidth_for(0.9, cluster, method)
    assert timeline.utilization(cluster, method, needed) >= 0.9
    assert timeline.utilization(cluster, method, needed * (1 - 1e-5)) < 0.9
    assert bandwidth_for(1.0, cluster, DP) is None  # DP's last message is always exposed


def test_a_method_with_more_fragments_than_layers_is_refused_with_the_fix():
    method = Method(name="streaming", label="S", sync_every=100, fragments=30)
    with pytest.raises(ConfigError, match="--fragments 30 exceeds the model's 24 layers"):
        timeline.utilization(Cluster(params=1e9, layers=24, step_time=0.1, workers=2), method, 1e9)
