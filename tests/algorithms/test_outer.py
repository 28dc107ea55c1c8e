"""Outer Nesterov pinned to research/algorithms.md §0 on cases computed by hand."""

import numpy as np
import pytest

from slowlink.algorithms.outer import OuterState, outer_nesterov


def arrays(*values):
    return {"w": np.array(values, dtype=np.float32)}


def test_nesterov_matches_the_equation_step_for_step_on_a_hand_computed_case():
    # η = 0.5, μ = 0.9, anchor θ0 = [1, 2]; Δ1 = [0.2, -0.4], Δ2 = [0.1, 0.1].
    # Round 1: b = Δ1 = [0.2, -0.4];          θ1 = θ0 − η(Δ1 + μb) = [1, 2] − 0.5·[0.38, -0.76] = [0.81, 2.38]
    # Round 2: b = 0.9·[0.2,-0.4] + [0.1,0.1] = [0.28, -0.26]
    #          θ2 = θ1 − η(Δ2 + μb) = [0.81, 2.38] − 0.5·[0.352, -0.134] = [0.634, 2.447]
    optimizer = outer_nesterov(lr=0.5, momentum=0.9)
    anchor = arrays(1.0, 2.0)
    state = optimizer.init(anchor)
    theta1, state = optimizer.update(arrays(0.2, -0.4), state, anchor)
    np.testing.assert_allclose(state.momentum["w"], [0.2, -0.4], atol=1e-7)
    np.testing.assert_allclose(theta1["w"], [0.81, 2.38], atol=1e-6)
    theta2, state = optimizer.update(arrays(0.1, 0.1), state, theta1)
    np.testing.assert_allclose(state.momentum["w"], [0.28, -0.26], atol=1e-6)
    np.testing.assert_allclose(theta2["w"], [0.634, 2.447], atol=1e-6)


def test_heavy_ball_steps_along_the_buffer_alone():
    # b = μ·b + Δ; θ = θ0 − η·b. Two rounds of Δ = 1 with η = 1, μ = 0.5: b = 1 then 1.5.
    optimizer = outer_nesterov(lr=1.0, momentum=0.5, nesterov=False)
    anchor = arrays(0.0)
    state = optimizer.init(anchor)
    theta, state = optimizer.update(arrays(1.0), state, anchor)
    assert theta["w"][0] == pytest.approx(-1.0)
    theta, state = optimizer.update(arrays(1.0), state, theta)
    assert theta["w"][0] == pytest.approx(-2.5)


def test_outer_lr_one_without_momentum_is_parameter_averaging():
    # Δ = mean(θ0 − θm) ⇒ θ0 − Δ = mean(θm).
    rng = np.random.default_rng(0)
    anchor = {"w": rng.normal(size=5).astype(np.float32)}
    locals_ = [{"w": rng.normal(size=5).astype(np.float32)} for _ in range(3)]
    delta = {"w": np.mean([anchor["w"] - local["w"] for local in locals_], axis=0)}
    optimizer = outer_nesterov(lr=1.0, momentum=0.0)
    theta, _ = optimizer.update(delta, optimizer.init(anchor), anchor)
    np.testing.assert_allclose(theta["w"], np.mean([local["w"] for local in locals_], axis=0), atol=1e-6)


def test_a_flush_round_applies_the_delta_once_and_leaves_the_momentum_alone():
    optimizer = outer_nesterov(lr=0.7, momentum=0.9)
    anchor = arrays(1.0)
    state = optimizer.init(anchor)
    _, state = optimizer.update(arrays(1.0), state, anchor)
    theta, after = optimizer.update(arrays(0.5), state, anchor, use_momentum=False)
    assert theta["w"][0] == pytest.approx(1.0 - 0.7 * 0.5)
    assert after is state


def test_torch_tensors_get_the_same_float32_bits_as_numpy_arrays():
    """One implementation runs on the model's device: on torch tensors the outer step gives exactly the
    parameters and buffer it gives on numpy arrays, over rounds, with and without momentum."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    anchor = {
        "w": rng.standard_normal(1000).astype(np.float32),
        "b": np.array([0.0, -0.0, 1e-40], np.float32),
    }
    deltas = [
        {name: rng.standard_normal(v.shape).astype(np.float32) * 1e-2 for name, v in anchor.items()}
        for _ in range(3)
    ]
    on_torch = {name: torch.from_numpy(v.copy()) for name, v in anchor.items()}
    optimizer = outer_nesterov(lr=0.7, momentum=0.9)
    state, state_t = optimizer.init(anchor), optimizer.init(on_torch)
    for i, delta in enumerate(deltas):
        use_momentum = i != 1
        delta_t = {name: torch.from_numpy(v.copy()) for name, v in delta.items()}
        anchor, state = optimizer.update(delta, state, anchor, use_momentum=use_momentum)
        on_torch, state_t = optimizer.update(delta_t, state_t, on_torch, use_momentum=use_momentum)
        for name in anchor:
            assert isinstance(on_torch[name], torch.Tensor) and isinstance(
                state_t.momentum[name], torch.Tensor
            )
            assert on_torch[name].numpy().tobytes() == anchor[name].tobytes()
            assert state_t.momentum[name].numpy().tobytes() == state.momentum[name].tobytes()


def test_the_share_aware_outer_step_is_outer_nesterov_on_a_full_round_and_a_share_of_it_otherwise():
    from slowlink.algorithms.outer import RoundShape, outer_nesterov, outer_nesterov_by_share

    anchor, delta = {"w": np.array([1.0, 2.0], np.float32)}, {"w": np.array([0.2, -0.4], np.float32)}
    buffer = {"w": np.array([0.1, 0.1], np.float32)}
    plain = outer_nesterov(0.5, 0.8).update(delta, OuterState(buffer), anchor)
    full = outer_nesterov_by_share(0.5, 0.8).update(delta, OuterState(buffer), anchor, shape=RoundShape(2, 2))
    np.testing.assert_array_equal(full[0]["w"], plain[0]["w"])
    # Half the live nodes, c = 0.5: b = 0.8^0.5·0.1 + 0.5·Δ = [0.1894, −0.1106];
    # θ = anchor − 0.5·(0.5·Δ + 0.5·0.8·b) = [1 − 0.5·(0.1 + 0.0758), 2 − 0.5·(−0.2 − 0.0442)]
    half, state = outer_nesterov_by_share(0.5, 0.8).update(
        delta, OuterState(buffer), anchor, shape=RoundShape(1, 2)
    )
    np.testing.assert_allclose(state.momentum["w"], [0.18944, -0.11056], atol=1e-5)
    np.testing.assert_allclose(half["w"], [0.91211, 2.12211], atol=1e-5)
    # Stale: no momentum push, θ = anchor − c·Δ; the buffer still takes c·Δ.
    stale, _ = outer_nesterov_by_share(0.5, 0.8).update(
        delta, OuterState(buffer), anchor, shape=RoundShape(1, 2, stale=True)
    )
    np.testing.assert_allclose(stale["w"], [0.9, 2.2], atol=1e-6)


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_the_outer_step_holds_no_fragment_sized_array_besides_its_two_results(share):
    # A merger holds a fragment's anchor, Δ and momentum already: the step adds the new parameters and
    # the new momentum, and temporaries of one tensor at a time (not a whole fragment of directions).
    import tracemalloc

    from slowlink.algorithms.outer import RoundShape, outer_nesterov_by_share

    rng = np.random.default_rng(0)
    fragment = [{f"t{i}": rng.normal(size=1 << 17).astype(np.float32) for i in range(8)} for _ in range(3)]
    anchor, delta, momentum = fragment
    optimizer = outer_nesterov_by_share(lr=0.7, momentum=0.9)
    tracemalloc.start()
    try:
        params, state = optimizer.update(delta, OuterState(momentum), anchor,
                                         shape=RoundShape(contributors=int(share * 2), live=2))  # fmt: skip
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    fragment_bytes = sum(values.nbytes for values in delta.values())
    assert peak < 2.4 * fragment_bytes, f"peak {peak / fragment_bytes:.2f} fragments"
    assert set(params) == set(state.momentum) == set(delta)
