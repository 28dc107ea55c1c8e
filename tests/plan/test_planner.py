"""The plan: its rows, its arithmetic, and which method it recommends at each bandwidth, and why."""

from dataclasses import replace
from functools import cache

import pytest

import slowlink as sl
from slowlink.errors import ConfigError
from slowlink.plan import PlanOptions, PlanRequest, make_plan, request_from_options, timeline
from slowlink.plan.model import Cluster
from slowlink.plan.planner import NEEDED_TARGETS
from slowlink.plan.recommend import candidates

CLUSTER = Cluster(params=1.5e9, layers=26, step_time=2.4, workers=8)
REQUEST = PlanRequest(
    cluster=CLUSTER, bandwidths=(100e6, 200e6, 1e9), sync_every=(100, 500), tokens=1e12, batch_tokens=32768
)


@cache
def the_plan():
    return make_plan(REQUEST)


def test_dp_comes_once_and_the_diloco_family_once_per_h():
    names = [(row.method.name, row.method.sync_every) for row in the_plan().rows]
    family = ["diloco", "streaming", "streaming-overlap", "streaming-overlap-fp4", "globalm1"]
    assert names == [("dp", 1)] + [(n, 100) for n in family] + [(n, 500) for n in family]
    fp4 = the_plan().rows[4].method
    assert (fp4.fragments, fp4.overlap_steps, fp4.encoding, fp4.bits) == (9, 1, "F4", 4.25)  # 26 layers / 3


def test_each_row_holds_the_models_utilization_and_the_time_it_implies():
    steps = 1e12 / (8 * 32768)
    for row in the_plan().rows:
        for w, cu, seconds in zip(REQUEST.bandwidths, row.utilization, row.train_seconds, strict=True):
            assert cu == timeline.utilization(CLUSTER, row.method, w)
            assert seconds == pytest.approx(steps * 2.4 / cu)


def test_the_bandwidth_needed_grows_with_the_target_and_reaches_it():
    for row in the_plan().rows:
        needed = [row.needed[t] for t in NEEDED_TARGETS]
        assert all(a < b for a, b in zip(needed, needed[1:], strict=False)), row.method.name
        for target in NEEDED_TARGETS:
            assert timeline.utilization(CLUSTER, row.method, row.needed[target]) >= target


def test_the_recommendation_is_the_first_candidate_in_loss_order_to_reach_the_target():
    options = candidates(REQUEST)
    assert options[0].name == "dp" and options[-1].name == "globalm1"
    for pick in the_plan().recommendations:
        assert pick.reaches_target and pick.utilization >= 0.9
        before = options[: options.index(pick.method)]
        assert all(timeline.utilization(CLUSTER, m, pick.bandwidth) < 0.9 for m in before)
    at_100, at_200, at_1g = the_plan().recommendations
    # 100 Mbit/s: only FP4 with a few steps of overlap hides a fragment; 1 Gbit/s: bf16 overlap does.
    assert (at_100.method.name, at_100.method.sync_every, at_100.method.overlap_steps) == (
        "streaming-overlap-fp4", 100, 4)  # fmt: skip
    assert (at_200.method.name, at_200.method.overlap_steps) == ("streaming-overlap-fp4", 1)
    assert (at_1g.method.name, at_1g.method.encoding) == ("streaming-overlap", "BF16")
    assert "DiLoCo, H=100 36.4%" in at_100.reason and "no loss regression" in at_100.reason


def test_the_recommended_configuration_is_a_valid_slowlink_diloco():
    for pick in the_plan().recommendations:
        config = eval(pick.config, {"sl": sl})  # noqa: S307 - our own text, checked to be a real config
        assert isinstance(config, sl.DiLoCo)
        assert (config.sync_every, config.fragments, config.overlap_steps, config.quorum_size) == (
            pick.method.sync_every, pick.method.fragments, pick.method.overlap_steps, 8)  # fmt: skip
        assert config.delta_dtype == ("F4" if pick.method.encoding == "F4" else None)


def test_a_fast_link_for_a_small_model_gets_plain_data_parallel():
    small = Cluster(params=1e8, layers=12, step_time=1.0, workers=4)
    pick = make_plan(PlanRequest(cluster=small, bandwidths=(100e9,))).recommendations[0]
    assert pick.method.name == "dp" and pick.config is None and pick.utilization > 0.9


def test_when_nothing_reaches_the_target_the_best_is_named_with_the_bandwidth_it_needs():
    request = replace(REQUEST, bandwidths=(10e6,), sync_every=(100,), target=0.999)
    pick = make_plan(request).recommendations[0]
    assert not pick.reaches_target
    assert (
        pick.reason.startswith("Nothing reaches the 100% target at 10 Mbit/s")
        or "Nothing reaches" in pick.reason
    )
    best = max(timeline.utilization(CLUSTER, m, 10e6) for m in candidates(request))
    assert pick.utilization == best and "needs" in pick.reason


def test_a_request_refuses_conflicting_options_with_the_fix():
    with pytest.raises(ConfigError, match="--tokens needs --batch-tokens"):
        PlanRequest(cluster=CLUSTER, bandwidths=(1e9,), tokens=1e12)
    with pytest.raises(ConfigError, match="--overlap-steps 100 must be below --sync-every 100"):
        PlanRequest(cluster=CLUSTER, bandwidths=(1e9,), overlap_steps=100)
    with pytest.raises(ConfigError, match="--fragments 40 exceeds --layers 26"):
        make_plan(PlanRequest(cluster=CLUSTER, bandwidths=(1e9,), fragments=40))


def test_fragments_default_to_one_per_three_layers_and_never_exceed_h():
    request = PlanRequest(cluster=CLUSTER, bandwidths=(1e9,), sync_every=(6, 100))
    assert request.fragments_for(100) == 9 and request.fragments_for(6) == 6


def test_the_step_time_can_come_from_flops_chips_and_mfu():
    options = PlanOptions(
        params="1.5B", bandwidth="1Gbps", batch_tokens="32768", chips="2", peak_flops="1e15", mfu="40%"
    )
    request = request_from_options(options)
    assert request.cluster.step_time == pytest.approx(6 * 1.5e9 * 32768 / (2 * 1e15 * 0.4))
    assert "40% MFU" in request.step_time_note and request.cluster.layers == 26
    with pytest.raises(ConfigError, match="give --step-time"):
        request_from_options(PlanOptions(params="1.5B", bandwidth="1Gbps"))
