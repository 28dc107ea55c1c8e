"""Robust merge rules (algorithms/robust.py) on hand-computed cases, bounds on what one bad contribution
can do, the outlier test on contribution norms, and the float64 norm."""

import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slowlink as sl
from slowlink.algorithms import robust
from slowlink.algorithms.merge import weighted_mean
from slowlink.algorithms.robust import NormClippedMean, TrimmedMean, l2_norm, norm_outliers
from slowlink.errors import ConfigError


def scalars(*values: float, weight: float = 1.0) -> list[tuple[dict[str, np.ndarray], float]]:
    """One contribution per value, each a 1-element tensor "w"."""
    return [({"w": np.array([v], np.float32)}, weight) for v in values]


def read_only(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Like the merger's deltas: read-only views."""
    for values in arrays.values():
        values.flags.writeable = False
    return arrays


# TrimmedMean


def test_trimmed_mean_ignores_one_huge_contribution_among_five():
    # trim 0.2 of 5 drops 1 at each end: 1 and 1e6 go, mean(2, 3, 4) = 3
    assert TrimmedMean(trim=0.2).merge(scalars(1, 2, 3, 4, 1e6))["w"][0] == 3.0


def test_trimmed_mean_trims_each_coordinate_on_its_own():
    # coordinate 0: 0 1 2 3 1e6 → mean(1, 2, 3) = 2; coordinate 1: −1e6 10 11 12 13 → mean(10, 11, 12) = 11
    rows = [[0, 10], [1, 11], [2, 12], [3, -1e6], [1e6, 13]]
    merged = TrimmedMean(trim=0.2).merge([({"w": np.array(r, np.float32)}, 1.0) for r in rows])
    np.testing.assert_array_equal(merged["w"], [2.0, 11.0])
    assert merged["w"].dtype == np.float32


def test_trimmed_mean_drops_two_at_each_end_of_ten():
    # ⌊0.2·10⌋ = 2: −1e9, −5e8, 7e8, 1e9 go; mean(1..6) = 3.5
    merged = TrimmedMean(trim=0.2).merge(scalars(-1e9, 5, -5e8, 1, 2, 7e8, 3, 4, 1e9, 6))
    assert merged["w"][0] == 3.5


@pytest.mark.parametrize(
    ("trim", "count", "k"),
    [(0.2, 1, 0), (0.2, 4, 0), (0.2, 5, 1), (0.2, 9, 1), (0.2, 10, 2), (0.29, 100, 29), (0.1, 30, 3),
     (0.49, 2, 0), (0.49, 3, 1), (0.0, 50, 0)],
)  # fmt: skip
def test_trimmed_counts_whole_values_at_each_end_and_always_keeps_one(trim, count, k):
    assert TrimmedMean(trim=trim).trimmed(count) == k


def test_trimmed_mean_with_too_few_contributions_to_trim_is_the_exact_unweighted_mean():
    # 4 < 1/0.2: nothing is trimmed, the outlier counts fully: (1 + 2 + 3 + 1e6) / 4
    assert TrimmedMean(trim=0.2).merge(scalars(1, 2, 3, 1e6))["w"][0] == np.float32(1000006 / 4)
    rng = np.random.default_rng(0)
    for count, trim in [(4, 0.2), (7, 0.0), (1, 0.4)]:
        deltas = [
            read_only({"a": rng.standard_normal((3, 5)).astype(np.float32), "s": np.full((), rng.standard_normal(), np.float32)})
            for _ in range(count)
        ]  # fmt: skip
        merged = TrimmedMean(trim=trim).merge((d, 1.0) for d in deltas)
        plain = weighted_mean((d, 1.0) for d in deltas)
        for name in plain:
            assert merged[name].shape == plain[name].shape
            np.testing.assert_allclose(merged[name], plain[name], rtol=1e-6, atol=1e-7)


def test_trimmed_mean_counts_each_node_once_whatever_its_samples():
    rule = TrimmedMean()
    assert rule.weight(samples=48, steps=3) == 1.0 == rule.weight(samples=1, steps=1)
    # weights are not used: mean(1, 2, 30) = 11, not (1 + 200 + 30) / 102
    assert (
        rule.merge([(d, w) for (d, _), w in zip(scalars(1, 2, 30), [1.0, 100.0, 1.0], strict=True)])["w"][0]
        == 11.0
    )
    # a weight of 0 leaves the contribution out: mean(1, 3) = 2
    assert (
        rule.merge([(d, w) for (d, _), w in zip(scalars(1, 1e9, 3), [1.0, 0.0, 1.0], strict=True)])["w"][0]
        == 2.0
    )


def test_trimmed_mean_refuses_an_empty_round_and_mismatched_tensors():
    with pytest.raises(ValueError, match="at least one contribution"):
        TrimmedMean().merge([])
    with pytest.raises(ValueError, match="at least one contribution"):
        TrimmedMean().merge(scalars(1, 2, weight=0.0))
    with pytest.raises(ValueError, match="'w' has shape"):
        TrimmedMean().merge([({"w": np.zeros(2, np.float32)}, 1.0), ({"w": np.zeros(3, np.float32)}, 1.0)])
    with pytest.raises(ValueError, match="holds tensors"):
        TrimmedMean().merge([({"w": np.zeros(2, np.float32)}, 1.0), ({"v": np.zeros(2, np.float32)}, 1.0)])


def test_trimmed_mean_gives_the_same_values_chunk_by_chunk(monkeypatch):
    rng = np.random.default_rng(1)
    deltas = [read_only({"a": rng.standard_normal((7, 11)).astype(np.float32)}) for _ in range(9)]
    deltas[3]["a"] = np.full((7, 11), 1e8, np.float32)  # a bad node
    whole = TrimmedMean(trim=0.25).merge((d, 1.0) for d in deltas)["a"]
    monkeypatch.setattr(robust, "CHUNK_VALUES", 20)  # 2 coordinates per block of 9: 39 blocks
    chunked = TrimmedMean(trim=0.25).merge((d, 1.0) for d in deltas)["a"]
    np.testing.assert_array_equal(chunked, whole)
    # the definition: sort each coordinate's 9 values, keep ranks 2..6 (⌊0.25·9⌋ = 2), average
    ranked = np.sort(np.stack([d["a"] for d in deltas]).astype(np.float64), axis=0)
    np.testing.assert_allclose(whole, ranked[2:7].mean(axis=0), rtol=1e-6)
    assert np.abs(whole).max() < 10  # the 1e8 never reaches the result


def test_trimmed_mean_stacks_a_chunk_not_the_round(monkeypatch):
    # 5 contributions of 2M float32 (8 MiB each): stacking them whole would allocate 40 MiB; chunk by
    # chunk, the merge allocates its 8 MiB result plus blocks of at most 5 × 65536 values.
    rng = np.random.default_rng(2)
    deltas = [read_only({"w": rng.standard_normal(1 << 21).astype(np.float32)}) for _ in range(5)]
    monkeypatch.setattr(robust, "CHUNK_VALUES", 1 << 16)
    tracemalloc.start()
    try:
        merged = TrimmedMean(trim=0.2).merge((d, 1.0) for d in deltas)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert merged["w"].nbytes == 8 << 20
    assert peak < 10 << 20, f"peak {peak / 2**20:.1f} MiB"


finite = st.floats(-1e6, 1e6, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    data=st.data(),
    count=st.integers(1, 12),
    width=st.integers(1, 6),
    trim=st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.45]),
)
def test_trimmed_mean_lies_between_the_smallest_and_largest_kept_value(data, count, width, trim):  # fmt: skip
    values = np.array(data.draw(st.lists(st.lists(finite, min_size=width, max_size=width), min_size=count, max_size=count)), np.float32)  # fmt: skip
    rule = TrimmedMean(trim=trim)
    merged = rule.merge(({"w": row}, 1.0) for row in values)["w"]
    k = rule.trimmed(count)
    ranked = np.sort(values, axis=0)
    assert np.all(ranked[k] <= merged) and np.all(merged <= ranked[count - k - 1])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    data=st.data(),
    honest_count=st.integers(4, 11),
    attack=st.floats(allow_nan=False, allow_infinity=False, width=32),
    other_attack=st.floats(allow_nan=False, allow_infinity=False, width=32),
)
def test_one_contribution_moves_the_trimmed_mean_at_most_across_the_others_range(
    data, honest_count, attack, other_attack
):
    # n ≥ 5 and trim 0.2: k ≥ 1, so every kept value lies within the honest values' range.
    honest = np.array(data.draw(st.lists(st.lists(finite, min_size=3, max_size=3), min_size=honest_count, max_size=honest_count)), np.float32)  # fmt: skip
    at = data.draw(st.integers(0, honest_count))  # where the bad node sits in the round

    def merged_with(value: float) -> np.ndarray:
        rows = list(honest)
        rows.insert(at, np.full(3, value, np.float32))
        return TrimmedMean(trim=0.2).merge(({"w": row}, 1.0) for row in rows)["w"].astype(np.float64)

    low, high = honest.min(axis=0), honest.max(axis=0)
    for value in (attack, other_attack):
        assert np.all(low <= merged_with(value)) and np.all(merged_with(value) <= high)
    moved = np.abs(merged_with(attack) - merged_with(other_attack))
    assert np.all(moved <= high.astype(np.float64) - low)


# NormClippedMean


def test_norm_clipped_mean_scales_a_huge_contribution_down_to_clip_times_the_median():
    # norms 1, 3, 1000; median 3, cap 2·3 = 6: 1000 becomes 6; (1 + 3 + 6) / 3
    merged = NormClippedMean(clip=2.0).merge(scalars(1, 3, 1000))
    assert merged["w"][0] == pytest.approx(10 / 3, rel=1e-6)


def test_norm_clipped_mean_takes_the_lower_median_so_one_of_two_cannot_raise_its_own_cap():
    # norms 1, 1000: lower median 1, cap 2; (1 + 2) / 2, then by samples 1 and 3: (1·1 + 3·2) / 4
    assert NormClippedMean(clip=2.0).merge(scalars(1, 1000))["w"][0] == pytest.approx(1.5, rel=1e-6)
    weighted = [(d, w) for (d, _), w in zip(scalars(1, 1000), [1.0, 3.0], strict=True)]
    assert NormClippedMean(clip=2.0).merge(weighted)["w"][0] == pytest.approx(7 / 4, rel=1e-6)


def test_norm_clipped_mean_clips_the_norm_of_the_whole_contribution():
    # norms 5 ({a: 3, b: 4}), 1, 2; clip 1 × median 2: the first is scaled by 2/5 to {a: 1.2, b: 1.6}
    contributions = [
        ({"a": np.array([3.0], np.float32), "b": np.array([4.0], np.float32)}, 1.0),
        ({"a": np.array([0.0], np.float32), "b": np.array([1.0], np.float32)}, 1.0),
        ({"a": np.array([0.0], np.float32), "b": np.array([2.0], np.float32)}, 1.0),
    ]
    merged = NormClippedMean(clip=1.0).merge(contributions)
    assert merged["a"][0] == pytest.approx(1.2 / 3, rel=1e-6)
    assert merged["b"][0] == pytest.approx((1.6 + 1 + 2) / 3, rel=1e-6)


def test_norm_clipped_mean_with_nothing_clipped_is_the_weighted_mean():
    rng = np.random.default_rng(3)
    contributions = [
        (read_only({"a": rng.standard_normal((4, 6)).astype(np.float32)}), float(samples))
        for samples in (16, 32, 8, 24)
    ]
    merged = NormClippedMean(clip=10.0).merge(contributions)
    np.testing.assert_allclose(merged["a"], weighted_mean(contributions)["a"], rtol=1e-6, atol=1e-7)


def test_norm_clipped_mean_against_a_zero_median_keeps_only_zeros():
    # norms 0, 0, 5: median 0, so 5 is scaled to 0
    assert NormClippedMean().merge(scalars(0, 0, 5))["w"][0] == 0.0


@pytest.mark.parametrize("scale", [1e3, 1e10, 1e30])
def test_a_bad_contribution_moves_the_norm_clipped_mean_by_a_fixed_bound_however_large(scale):
    # 4 honest Δ of norm 2 (never clipped: the lower median is 2, the cap 2·2 = 4) and one bad Δ of any
    # size, clipped to norm 4: it moves the mean by exactly w_bad·4 / Σw = 8·4 / 40 = 0.8.
    rng = np.random.default_rng(4)
    honest = [2 * v / np.linalg.norm(v) for v in rng.standard_normal((4, 50))]
    bad = scale * rng.standard_normal(50)
    contributions = [({"w": v.astype(np.float32)}, 8.0) for v in [*honest, bad]]
    merged = NormClippedMean(clip=2.0).merge(contributions)["w"].astype(np.float64)
    honest_part = sum(8.0 * v for v in honest) / 40.0
    assert np.linalg.norm(merged - honest_part) == pytest.approx(0.8, rel=1e-5)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    honest_count=st.integers(1, 8),
    bad_scale=st.floats(1e-3, 1e30),
    clip=st.floats(1.0, 5.0),
)
def test_one_bad_contribution_never_pushes_the_norm_past_clip_times_the_largest_honest_norm(
    seed, honest_count, bad_scale, clip
):
    rng = np.random.default_rng(seed)
    honest = [rng.standard_normal(20).astype(np.float32) * rng.uniform(0.1, 10) for _ in range(honest_count)]
    bad = (bad_scale * rng.standard_normal(20)).astype(np.float32)
    weights = rng.integers(1, 100, honest_count + 1).astype(float)
    rows = [*honest, bad]
    merged = NormClippedMean(clip=clip).merge(({"w": r}, w) for r, w in zip(rows, weights, strict=True))["w"]
    largest = max(float(np.linalg.norm(v.astype(np.float64))) for v in honest)
    assert l2_norm({"w": merged}) <= clip * largest * (1 + 1e-5)


def test_norm_clipped_mean_weighs_by_samples_and_refuses_an_empty_round():
    assert NormClippedMean().weight(samples=48, steps=3) == 48.0
    with pytest.raises(ValueError, match="at least one contribution"):
        NormClippedMean().merge([])


# norm_outliers


def test_a_norm_far_above_the_others_median_is_an_outlier_with_a_reason_naming_the_numbers():
    # d: the others' norms 1, 1.2, 0.9 have median 1; 50 > 10 × 1. a: others 1.2, 0.9, 50 → 1.2; 1 ≤ 12.
    flagged = norm_outliers({"a": 1.0, "b": 1.2, "c": 0.9, "d": 50.0}, factor=10)
    assert list(flagged) == ["d"]
    reason = flagged["d"]
    assert "L2 norm 50 " in reason and "times 1, the median norm" in reason and "limit of 10 times" in reason
    assert "3 other contributions" in reason


def test_the_outlier_limit_is_strictly_above_factor_times_the_median():
    assert norm_outliers({"a": 1.0, "b": 1.0, "c": 10.0}, factor=10) == {}
    assert list(norm_outliers({"a": 1.0, "b": 1.0, "c": 10.001}, factor=10)) == ["c"]


def test_one_or_two_contributions_are_no_outliers_by_size_without_history():
    assert norm_outliers({}, factor=10) == {}
    assert norm_outliers({"a": 1e12}, factor=10) == {}
    assert norm_outliers({"a": 1.0, "b": 1e12}, factor=10) == {}


def test_one_or_two_contributions_are_judged_against_the_largest_recently_merged_norm():
    # history: norms 0.5, 2 and 1 were merged lately; the largest is 2, so 20 passes and 20.01 does not.
    history = [0.5, 2.0, 1.0]
    assert norm_outliers({"a": 20.0}, factor=10, history=history) == {}
    flagged = norm_outliers({"a": 20.01}, factor=10, history=history)
    assert (
        "times 2, 1 step(s) at the largest norm per step of the fragment's 3 recently merged" in flagged["a"]
    )
    # a Δ spanning 4 steps is judged against 4 × 2: the steps a node carries from missed rounds count
    assert norm_outliers({"a": 79.0}, factor=10, history=history, steps={"a": 4}) == {}
    assert list(norm_outliers({"a": 81.0}, factor=10, history=history, steps={"a": 4})) == ["a"]
    # of two, the other's norm is no reference (a flush of a few steps is small); the history is
    assert norm_outliers({"a": 0.01, "b": 15.0}, factor=10, history=history) == {}
    assert list(norm_outliers({"a": 0.01, "b": 1e30}, factor=10, history=history)) == ["b"]
    # with three or more, the round's own median decides, as before
    assert norm_outliers({"a": 1.0, "b": 1.0, "c": 15.0}, factor=10, history=[100.0]) == {"c": mock_any()}


def test_a_nodes_own_check_judges_by_its_history_and_needs_one():
    # A node's merged contributions moved 0.5, 2 and 1 per step: 4 steps may reach 10 × 4 × 2 = 80.
    history = [0.5, 2.0, 1.0]
    assert robust.beyond_history(80.0, 4, history, 10.0) is None
    reason = robust.beyond_history(81.0, 4, history, 10.0, whose="this node's")
    assert reason == ("its Δ's L2 norm 81 is 10.1 times 8, 4 step(s) at the largest norm per step of this "
                      "node's 3 recently merged contributions, above the limit of 10 times")  # fmt: skip
    # No history (a first contribution), or only a non-finite one: nothing to judge by, however large.
    assert robust.beyond_history(1e30, 4, [], 10.0) is None
    assert robust.beyond_history(1e30, 4, [math.nan], 10.0) is None


class mock_any:  # noqa: N801 — equal to any reason string
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str)


def test_of_three_only_a_lone_large_norm_is_an_outlier():
    assert list(norm_outliers({"a": 1.0, "b": 1.0, "c": 100.0}, factor=10)) == ["c"]
    # two large against one small: the others' medians are 50.5 and 100, no one stands out
    assert norm_outliers({"a": 1.0, "b": 100.0, "c": 100.0}, factor=10) == {}


def test_a_non_finite_norm_is_always_an_outlier_and_left_out_of_the_medians():
    assert list(norm_outliers({"a": 1.0, "b": math.inf}, factor=10)) == ["b"]
    # d's others: 1 and 1.1 (nan left out), median 1.05; 40 > 10.5
    flagged = norm_outliers({"a": 1.0, "b": 1.1, "c": math.nan, "d": 40.0}, factor=10)
    assert list(flagged) == ["c", "d"]
    assert "not a finite number" in flagged["c"] and "times 1.05, the median" in flagged["d"]


def test_a_zero_median_gives_no_scale_to_judge_by():
    assert norm_outliers({"a": 0.0, "b": 0.0, "c": 5.0}, factor=10) == {}


def test_norm_outliers_refuses_a_bad_factor_or_a_negative_norm():
    for factor in (1.0, 0.5, math.nan, math.inf, True, "10"):
        with pytest.raises(ConfigError, match=r"factor=.* is invalid: it must be a number in \(1.0, ∞\)"):
            norm_outliers({"a": 1.0}, factor=factor)
    with pytest.raises(ValueError, match="'b' has a negative norm"):
        norm_outliers({"a": 1.0, "b": -1.0}, factor=10)


# l2_norm


def test_l2_norm_spans_every_tensor():
    # √(3² + 4²) = 5 across two tensors of different shapes
    assert l2_norm({"a": np.array([3.0], np.float32), "b": np.array([[4.0]], np.float32)}) == 5.0
    assert l2_norm({}) == 0.0


def test_l2_norm_accumulates_in_float64_where_float32_would_overflow():
    # 1e30² overflows float32; √(4·1e60) = 2e30
    assert l2_norm({"w": np.full(4, 1e30, np.float32)}) == pytest.approx(2e30, rel=1e-7)


def test_l2_norm_chunk_by_chunk_matches_the_float64_norm(monkeypatch):
    rng = np.random.default_rng(5)
    arrays = read_only({"a": rng.standard_normal((10, 7)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)})  # fmt: skip
    reference = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in arrays.values()))
    assert l2_norm(arrays) == pytest.approx(reference, rel=1e-12)
    monkeypatch.setattr(robust, "NORM_CHUNK", 3)
    assert l2_norm(arrays) == pytest.approx(reference, rel=1e-12)


def test_l2_norm_of_torch_tensors_is_the_norm_of_their_numpy_arrays(monkeypatch):
    """A contribution's norm is taken where its Δ is, on the model's device: one implementation for both."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    arrays = {"a": rng.standard_normal((10, 7)).astype(np.float32), "b": np.array(1e30, np.float32)}
    tensors = {name: torch.from_numpy(values.copy()) for name, values in arrays.items()}
    reference = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in arrays.values()))
    assert l2_norm(tensors) == pytest.approx(reference, rel=1e-12)  # no float32 overflow at 1e30² either
    monkeypatch.setattr(robust, "NORM_CHUNK", 3)
    assert l2_norm(tensors) == pytest.approx(reference, rel=1e-12)


def test_l2_norm_never_widens_a_whole_tensor():
    values = np.ones(1 << 22, np.float32)  # a float64 copy would be 32 MiB
    tracemalloc.start()
    try:
        norm = l2_norm({"w": values})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert norm == 2048.0  # √(2²²)
    assert peak < 12 << 20, f"peak {peak / 2**20:.1f} MiB"


# configuration


@pytest.mark.parametrize(
    ("make", "named", "valid"),
    [
        (lambda: TrimmedMean(trim=0.5), "trim=0.5", "[0.0, 0.5)"),
        (lambda: TrimmedMean(trim=-0.1), "trim=-0.1", "[0.0, 0.5)"),
        (lambda: TrimmedMean(trim="0.2"), "trim='0.2'", "[0.0, 0.5)"),
        (lambda: TrimmedMean(trim=True), "trim=True", "[0.0, 0.5)"),
        (lambda: TrimmedMean(trim=math.nan), "trim=nan", "[0.0, 0.5)"),
        (lambda: NormClippedMean(clip=0.5), "clip=0.5", "[1.0, ∞)"),
        (lambda: NormClippedMean(clip=math.inf), "clip=inf", "[1.0, ∞)"),
        (lambda: NormClippedMean(clip=None), "clip=None", "[1.0, ∞)"),
    ],
)
def test_a_bad_rule_option_is_refused_with_its_name_and_valid_range(make, named, valid):
    with pytest.raises(ConfigError) as error:
        make()
    assert f"{named} is invalid" in str(error.value) and valid in str(error.value)


def test_rules_record_their_name_and_options_for_run_json():
    assert TrimmedMean().to_dict() == {"name": "TrimmedMean", "trim": 0.2}
    assert TrimmedMean(trim=0).to_dict() == {"name": "TrimmedMean", "trim": 0.0}
    assert NormClippedMean(clip=3).to_dict() == {"name": "NormClippedMean", "clip": 3.0}
    assert TrimmedMean(trim=0.2) == TrimmedMean() != TrimmedMean(trim=0.1)
    config = sl.DiLoCo(sync_every=10, merge=sl.TrimmedMean(trim=0.1)).to_dict()
    assert config["merge"] == {"name": "TrimmedMean", "trim": 0.1}
    assert (
        sl.DiLoCo(sync_every=10, merge=sl.NormClippedMean()).to_dict()["merge"]["name"] == "NormClippedMean"
    )
