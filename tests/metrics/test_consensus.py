"""sl.metrics.consensus (research/algorithms.md §4.4): the relative L2 distance of parameters from their mean,
and the generalized Jensen–Shannon divergence of the models' next-token distributions."""

import copy
import math

import numpy as np
import pytest
import torch

import slowlink as sl


def tiny_lm(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))


BATCH = torch.arange(16).reshape(2, 8)


def test_identical_models_are_zero_apart():
    models = [copy.deepcopy(tiny_lm()) for _ in range(3)]
    found = sl.metrics.consensus(models, BATCH)
    assert found.l2 == 0.0 and found.js == pytest.approx(0.0, abs=1e-12)


def test_l2_is_the_mean_squared_distance_from_the_mean_over_the_means_norm():
    # x = (1, 1), (3, 1): mean (2, 1), ‖x_i − x̄‖² = 1 each, ‖x̄‖² = 5: (1 + 1) / 2 / 5 = 0.2.
    params = [{"x": np.array([1.0, 1.0])}, {"x": np.array([3.0, 1.0])}]
    assert sl.metrics.l2_consensus(params) == pytest.approx(0.2)
    assert sl.metrics.consensus(params).js is None


def test_js_is_symmetric_and_bounded_by_log_m():
    models = [tiny_lm(seed) for seed in range(4)]
    forward = sl.metrics.js_consensus(models, BATCH)
    assert forward == pytest.approx(sl.metrics.js_consensus(models[::-1], BATCH), rel=1e-12)
    assert 0 < forward < math.log(4)
    # Four models certain of four different tokens: as far apart as M distributions can be, ln M.
    certain = []
    for token in range(4):
        model = tiny_lm()
        with torch.no_grad():
            model[1].weight.zero_()
            model[1].bias.zero_()
            model[1].bias[token] = 60.0
        certain.append(model)
    assert sl.metrics.js_consensus(certain, BATCH) == pytest.approx(math.log(4), abs=1e-9)


def test_js_sees_a_loss_spike_that_l2_rates_like_a_smooth_drift():
    # Two ways of moving one of two models by the same L2 distance r: spread over every weight (a drift), or
    # all on one token's output bias (what a loss spike does to a model: one prediction jumps).
    base, r = tiny_lm(), 3.0
    drift, spike = copy.deepcopy(base), copy.deepcopy(base)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        noise = [torch.randn(p.shape, generator=generator) for p in drift.parameters()]
        norm = math.sqrt(sum(float((n**2).sum()) for n in noise))
        for p, n in zip(drift.parameters(), noise, strict=True):
            p += r * n / norm
        spike[1].bias[3] += r
    drifted, spiked = sl.metrics.consensus([base, drift], BATCH), sl.metrics.consensus([base, spike], BATCH)
    assert drifted.l2 == pytest.approx(spiked.l2, rel=0.25)  # L2 can hardly tell them apart
    assert spiked.js > 3 * drifted.js  # JS can


def test_models_of_different_schemas_are_refused_by_name():
    with pytest.raises(sl.ConfigError, match="names differ"):
        sl.metrics.l2_consensus([{"a": np.zeros(2)}, {"b": np.zeros(2)}])
    with pytest.raises(sl.ConfigError, match="neither a model"):
        sl.metrics.l2_consensus([3, 4])
