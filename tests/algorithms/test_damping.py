"""Outer momentum damped when a round's Δ opposes it (algorithms/damping.py): hand cases, numpy and torch
alike, and where the DiLoCo configuration turns it on (without a barrier only)."""

import numpy as np
import pytest
import torch

import slowlink as sl
from slowlink.algorithms.damping import damp_opposed


def test_a_buffer_along_or_across_the_round_is_kept_as_it_is():
    delta = {"a": np.array([1.0, 0.0], np.float32), "b": np.array([0.0], np.float32)}
    along = {"a": np.array([3.0, 1.0], np.float32), "b": np.array([-5.0], np.float32)}  # ⟨Δ, b⟩ = 3 > 0
    across = {"a": np.array([0.0, 2.0], np.float32), "b": np.array([1.0], np.float32)}  # ⟨Δ, b⟩ = 0
    assert damp_opposed(delta, along) is along and damp_opposed(delta, across) is across
    assert damp_opposed(delta, {}) == {}


def test_an_opposed_buffer_loses_the_square_of_one_plus_the_cosine():
    # Over the whole fragment: ⟨Δ, b⟩ = −2, ‖Δ‖ = √2, ‖b‖ = 2, cos = −1/√2, factor (1 − 1/√2)² = 0.08579.
    delta = {"a": np.array([-1.0], np.float32), "b": np.array([1.0], np.float32)}
    buffer = {"a": np.array([2.0], np.float32), "b": np.array([0.0], np.float32)}
    damped = damp_opposed(delta, buffer)
    np.testing.assert_allclose(damped["a"], [2.0 * (1 - 2**-0.5) ** 2], rtol=1e-6)
    assert damped["b"][0] == 0.0 and buffer["a"][0] == 2.0  # the input is only read
    reversed_ = damp_opposed(delta, {name: -3.0 * values for name, values in delta.items()})
    assert all(np.all(values == 0.0) for values in reversed_.values())  # Δ points straight back: b is gone


def test_torch_tensors_give_numpy_s_values():
    rng = np.random.default_rng(0)
    delta = {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "v": rng.standard_normal(5).astype(np.float32),
    }
    buffer = {name: (-0.5 * values + 0.1 * rng.standard_normal(values.shape)).astype(np.float32)
              for name, values in delta.items()}  # fmt: skip
    on_host = damp_opposed(delta, buffer)
    as_torch = damp_opposed({n: torch.from_numpy(v) for n, v in delta.items()},
                            {n: torch.from_numpy(v) for n, v in buffer.items()})  # fmt: skip
    assert 0 < float(on_host["w"][0, 0] / buffer["w"][0, 0]) < 0.2
    for name in delta:
        np.testing.assert_allclose(as_torch[name].numpy(), on_host[name], rtol=1e-5)


def outer_step(algorithm: sl.DiLoCo, delta: float, buffer: float) -> tuple[float, float]:
    params, state = algorithm.outer_step(
        {"w": np.array([delta], np.float32)}, {"w": np.array([buffer], np.float32)},
        {"w": np.zeros(1, np.float32)}, flush_only=False,
    )  # fmt: skip
    return float(params["w"][0]), float(state["w"][0])


def test_the_default_damps_without_a_barrier_and_standard_diloco_stays_outer_nesterov():
    # Δ = −1 against b = 1 (cos = −1): damped, b ← 0.9·0 + Δ = −1 and θ = −0.7·(−1 + 0.9·−1) = 1.33;
    # outer Nesterov: b ← 0.9·1 − 1 = −0.1 and θ = −0.7·(−1 − 0.09) = 0.763.
    decoupled = sl.DiLoCo(sync_every=10)
    standard = sl.DiLoCo(sync_every=10, overlap_steps=0, quorum_size=2)
    assert decoupled.damps_momentum and not standard.damps_momentum
    np.testing.assert_allclose(outer_step(decoupled, -1.0, 1.0), (1.33, -1.0), rtol=1e-6)
    np.testing.assert_allclose(outer_step(standard, -1.0, 1.0), (0.763, -0.1), rtol=1e-6)
    np.testing.assert_allclose(outer_step(sl.DiLoCo(sync_every=10, damp_momentum=False), -1.0, 1.0),
                               (0.763, -0.1), rtol=1e-6)  # fmt: skip
    assert sl.DiLoCo(sync_every=10, overlap_steps=1, damp_momentum=True).damps_momentum
    assert decoupled.to_dict()["damp_momentum"] is None  # as a run.json without the key reads it


def test_a_damp_momentum_that_is_not_a_bool_is_refused_by_name():
    with pytest.raises(sl.ConfigError, match="damp_momentum='yes'"):
        sl.DiLoCo(sync_every=10, damp_momentum="yes")
