"""The planner against published numbers: Streaming DiLoCo's Table 4 (75 cells) and the Factored
Gossip DiLoCo blog's utilizations and training times (values and sources: slowlink/plan/anchors.py)."""

from functools import cache

import pytest

from slowlink.plan import closed_form, timeline
from slowlink.plan.anchors import (
    FGDILOCO_BATCH,
    FGDILOCO_CLUSTER,
    FGDILOCO_UTILIZATION,
    FGDILOCO_WEEKS_1T_AT_200M,
    TABLE4_GBITS,
    TABLE4_ROWS,
    TABLE4_SCALES,
    TABLE4_TARGETS,
    table4,
)
from slowlink.plan.model import Method

CELLS = [(row, scale, target) for row in TABLE4_ROWS for scale in TABLE4_SCALES for target in TABLE4_TARGETS]


@cache
def cells_by_key(model_name: str = "timeline"):
    model = {"timeline": timeline.utilization, "first-order": closed_form.first_order}[model_name]
    return {(c.row, c.scale, c.target): c for c in table4(model)}


def test_table4_holds_75_cells_as_printed():
    assert len(CELLS) == 75 == len(cells_by_key())
    assert (
        TABLE4_GBITS["Data-Parallel"]["1B"][4] == 569.0 and TABLE4_GBITS["+ overlap + FP4"]["100B"][0] == 0.5
    )


@pytest.mark.parametrize(("row", "scale", "target"), CELLS, ids=[f"{r}-{s}-{t:.0%}" for r, s, t in CELLS])
def test_each_table4_cell_is_reproduced_within_one_and_a_half_times(row, scale, target):
    cell = cells_by_key()[(row, scale, target)]
    assert cell.ratio <= 1.5, f"paper {cell.paper_gbits} Gbit/s, timeline {cell.model_gbits:.2f} Gbit/s"


def test_at_least_nine_in_ten_table4_cells_are_within_one_point_two_times():
    close = [c for c in cells_by_key().values() if c.ratio <= 1.2]
    assert len(close) >= 68  # 90% of 75; docs/planning.md gives the count reached and the worst cell


def test_the_data_parallel_99_percent_cells_need_the_per_layer_tail():
    # At 99% the step's last layer message, sent after the backward ends, is what stays exposed; a
    # model without layers hides it behind ⅔ of the backward and misses both cells by more than 1.5×.
    for scale in ("1B", "10B"):
        assert cells_by_key()[("Data-Parallel", scale, 0.99)].ratio <= 1.2
        assert cells_by_key("first-order")[("Data-Parallel", scale, 0.99)].ratio > 1.5


FG_METHODS = {
    "dp": Method(name="dp", label="DP"),
    "diloco": Method(name="diloco", label="DiLoCo", sync_every=100),
    "globalm1": Method(name="globalm1", label="GlobalM1", sync_every=100, overlap_steps=100),
}


@pytest.mark.parametrize(("name", "bandwidth"), list(FGDILOCO_UTILIZATION))
def test_fgdiloco_utilizations_are_within_three_points(name, bandwidth):
    reported = FGDILOCO_UTILIZATION[(name, bandwidth)]
    ours = timeline.utilization(FGDILOCO_CLUSTER, FG_METHODS[name], bandwidth)
    assert abs(ours - reported) <= 0.03, f"{name} at {bandwidth / 1e6:.0f} Mbps: {ours:.3f} vs {reported}"


@pytest.mark.parametrize("name", ["globalm1", "diloco"])
def test_a_trillion_tokens_at_200_mbps_takes_the_blogs_weeks_within_ten_percent(name):
    steps = 1e12 / (FGDILOCO_CLUSTER.workers * FGDILOCO_BATCH)
    cu = timeline.utilization(FGDILOCO_CLUSTER, FG_METHODS[name], 200e6)
    weeks = steps * FGDILOCO_CLUSTER.step_time / cu / (7 * 86400)
    assert weeks == pytest.approx(FGDILOCO_WEEKS_1T_AT_200M[name], rel=0.10)


def test_diloco_takes_about_1_8_times_globalm1s_time_at_200_mbps_whatever_the_batch():
    # The ratio does not depend on the assumed batch: it is the blog's 29/16 = 1.81.
    ratio = timeline.utilization(FGDILOCO_CLUSTER, FG_METHODS["globalm1"], 200e6) / timeline.utilization(
        FGDILOCO_CLUSTER, FG_METHODS["diloco"], 200e6
    )
    assert ratio == pytest.approx(29 / 16, rel=0.10)
