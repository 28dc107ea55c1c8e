"""Radial-directional averaging and token-quality weights (research/algorithms.md §3, step 4 and 6), on
hand-computed cases."""

import math

import numpy as np
import pytest

import slowlink as sl
from slowlink.algorithms.merge import WeightedMean, weighted_mean


def arrays(**values) -> dict:
    return {name: np.asarray(v, np.float32) for name, v in values.items()}


def test_orthogonal_contributions_keep_their_length_where_the_plain_mean_shrinks_it():
    # Two orthogonal Δs of length 2: the mean has length √2, RDA keeps 2, along (1, 1)/√2.
    pairs = [(arrays(w=[2.0, 0.0]), 1.0), (arrays(w=[0.0, 2.0]), 1.0)]
    merged = sl.RDA().merge(pairs)
    np.testing.assert_allclose(merged["w"], [math.sqrt(2), math.sqrt(2)], rtol=1e-6)
    assert np.linalg.norm(weighted_mean(pairs)["w"]) == pytest.approx(math.sqrt(2))


def test_the_radius_is_the_weighted_mean_of_the_norms_and_the_direction_the_weighted_mean_direction():
    # w = 3 for [3, 0] (norm 3), w = 1 for [0, 1] (norm 1): radius (3·3 + 1·1)/4 = 2.5;
    # direction φ(3·[1, 0] + 1·[0, 1]) = [3, 1]/√10.
    merged = sl.RDA().merge([(arrays(w=[3.0, 0.0]), 3.0), (arrays(w=[0.0, 1.0]), 1.0)])
    np.testing.assert_allclose(merged["w"], 2.5 * np.array([3.0, 1.0]) / math.sqrt(10), rtol=1e-6)


def test_one_contribution_or_identical_ones_merge_to_themselves():
    one = arrays(w=[[1.0, -2.0], [0.5, 4.0]], b=[3.0])
    np.testing.assert_allclose(sl.RDA().merge([(one, 5.0)])["w"], one["w"], rtol=1e-6)
    merged = sl.RDA().merge([(one, 1.0), (one, 7.0)])
    for name in one:
        np.testing.assert_allclose(merged[name], one[name], rtol=1e-6)


def test_each_tensor_is_merged_on_its_own_and_plain_tensors_take_the_weighted_mean():
    pairs = [(arrays(embed=[2.0, 0.0], w=[2.0, 0.0]), 1.0), (arrays(embed=[0.0, 2.0], w=[0.0, 20.0]), 1.0)]
    merged = sl.RDA(plain="embed").merge(pairs)
    np.testing.assert_allclose(merged["embed"], [1.0, 1.0])  # the mean
    # w: radius (2 + 20)/2 = 11, direction φ([1, 0] + [0, 1]): the norms of the other tensor play no part.
    np.testing.assert_allclose(merged["w"], 11 * np.array([1.0, 1.0]) / math.sqrt(2), rtol=1e-6)


def test_a_zero_contribution_has_no_direction_and_a_nan_one_makes_the_result_not_finite():
    merged = sl.RDA().merge([(arrays(w=[0.0, 0.0]), 1.0), (arrays(w=[0.0, 4.0]), 1.0)])
    np.testing.assert_allclose(merged["w"], [0.0, 2.0])  # radius (0 + 4)/2 along [0, 1]
    bad = sl.RDA().merge([(arrays(w=[np.nan, 1.0]), 1.0), (arrays(w=[0.0, 4.0]), 1.0)])
    assert not np.isfinite(bad["w"]).all()  # so the merger leaves the largest out and tries again


def test_an_empty_round_and_bad_options_are_refused():
    with pytest.raises(ValueError, match="at least one contribution"):
        sl.RDA().merge([])
    with pytest.raises(sl.ConfigError, match="plain"):
        sl.RDA(plain="(")
    with pytest.raises(sl.ConfigError, match="weights"):
        sl.RDA(weights="tokens")
    with pytest.raises(sl.ConfigError, match="weights"):
        WeightedMean(weights="steps")


def test_quality_weights_are_samples_times_samples_per_step():
    # 64 samples over 2 steps: 64 · 32; a node with half the batch over the same steps weighs a quarter.
    assert WeightedMean(weights="quality").weight(samples=64, steps=2) == 64 * 32
    assert sl.RDA(weights="quality").weight(samples=32, steps=2) == 32 * 16
    assert WeightedMean().weight(samples=64, steps=2) == 64.0


def test_the_default_weighted_mean_records_what_runs_before_the_option_recorded():
    # run.json of an older run names {"name": "WeightedMean"}: a joiner with the default must still match.
    assert WeightedMean().to_dict() == {"name": "WeightedMean"}
    assert WeightedMean(weights="quality").to_dict() == {"name": "WeightedMean", "weights": "quality"}
    assert sl.RDA(plain="embed").to_dict() == {"name": "RDA", "plain": "embed", "weights": "samples"}


def test_a_simulated_barrier_round_commits_the_rda_of_the_nodes_deltas():
    """Through the engine: two nodes, one barrier round, outer_lr 1 and no momentum, so the commit is
    anchor − RDA(Δ_1, Δ_2); each node's Δ is computed here by replaying its steps."""
    import torch

    from slowlink import sim

    def make_model():
        torch.manual_seed(0)
        return torch.nn.Linear(3, 2)

    def batches(worker, step):
        generator = torch.Generator().manual_seed(100 * worker + step)
        x = torch.randn(8, 3, generator=generator)
        teacher = torch.tensor([[1.0, -2.0], [0.5, 1.0], [-1.0, 0.0]]) * (1 if worker == 0 else -3)
        return x, x @ teacher  # opposite teachers: Δs far from parallel, so RDA ≠ the mean

    def loss(model, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    method = sl.DiLoCo(sync_every=3, quorum_size=2, overlap_steps=0, outer_lr=1.0, outer_momentum=0.0,
                       merge=sl.RDA(), max_norm_ratio=None)  # fmt: skip
    result = sim.run(method, make_model, batches, workers=2, steps=3, loss=loss,
                     optimizer=lambda p: torch.optim.SGD(p, lr=0.1))  # fmt: skip
    start = make_model()
    deltas = []
    for worker in range(2):
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            optimizer.zero_grad()
            loss(model, batches(worker, step)).backward()
            optimizer.step()
        deltas.append(
            {
                n: (p0 - p).detach().numpy()
                for (n, p0), p in zip(start.named_parameters(), model.parameters(), strict=True)
            }
        )
    merged = sl.RDA().merge([(d, 24.0) for d in deltas])
    committed = dict(result.models[0].named_parameters())
    for name, p0 in start.named_parameters():
        np.testing.assert_allclose(
            committed[name].detach().numpy(), p0.detach().numpy() - merged[name], atol=1e-6
        )
