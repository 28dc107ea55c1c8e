"""Merge rules and alignment rules on hand-computed cases."""

import numpy as np
import pytest

from slowlink.algorithms.merge import WeightedMean, weighted_mean
from slowlink.algorithms.mixing import carry_change, carry_overlap_change


def test_weighted_mean_weights_each_delta_by_its_samples():
    # (1·[2, 0] + 3·[0, 4]) / 4 = [0.5, 3]
    merged = weighted_mean(
        [({"w": np.array([2.0, 0.0], np.float32)}, 1.0), ({"w": np.array([0.0, 4.0], np.float32)}, 3.0)]
    )
    np.testing.assert_allclose(merged["w"], [0.5, 3.0])


def test_weighted_mean_refuses_an_empty_round():
    with pytest.raises(ValueError):
        weighted_mean([])
    with pytest.raises(ValueError):
        weighted_mean([({"w": np.ones(2, np.float32)}, 0.0)])


def test_weighted_mean_rule_uses_the_reported_samples_as_weight():
    assert WeightedMean().weight(samples=48, steps=3) == 48.0


def test_carry_moves_the_local_parameters_by_the_commits_change():
    # local 5 trained from anchor 3; the commit moves 3 → 1: adding −2 gives 3, keeping its +2.
    assert dict(carry_change({"w": np.array([3.0])}, {"w": np.array([1.0])}))["w"][0] == pytest.approx(-2.0)


def test_carry_overlap_keeps_only_the_steps_after_the_snapshot():
    # anchor 0, snapshot −2 (Δ = 2), now −3; the commit is −2.5. θ ← −3 + (−2.5 − (−2)) = −3.5:
    # the commit plus the one step (−1) trained after the snapshot.
    change = dict(
        carry_overlap_change({"w": np.array([0.0])}, {"w": np.array([-2.5])}, {"w": np.array([2.0])})
    )
    assert -3.0 + change["w"][0] == pytest.approx(-3.5)


def test_torch_tensors_get_the_same_float32_bits_as_numpy_arrays():
    """The merge and the carry run on the model's device as they do on the host: the same bits."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)

    def fragment() -> dict:
        return {
            "w": rng.standard_normal(777).astype(np.float32),
            "z": np.array([0.0, -0.0, 3e-39], np.float32),
        }

    def on_torch(arrays: dict) -> dict:
        return {name: torch.from_numpy(v.copy()) for name, v in arrays.items()}

    def same_bits(tensors, arrays) -> bool:
        tensors, arrays = dict(tensors), dict(arrays)
        return all(isinstance(tensors[n], torch.Tensor) and tensors[n].numpy().tobytes() == arrays[n].tobytes()
                   for n in arrays)  # fmt: skip

    deltas, weights = [fragment() for _ in range(3)], [16.0, 3.0, 7.5]
    merged = weighted_mean(zip(deltas, weights, strict=True))
    assert same_bits(weighted_mean(zip(map(on_torch, deltas), weights, strict=True)), merged)
    old, new, delta = fragment(), fragment(), fragment()
    assert same_bits(carry_change(on_torch(old), on_torch(new)), carry_change(old, new))
    assert same_bits(
        carry_overlap_change(on_torch(old), on_torch(new), on_torch(delta)),
        carry_overlap_change(old, new, delta),
    )
