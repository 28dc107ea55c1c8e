"""The fast top-k per chunk (algorithms/top_k.py) pinned to its definition, torch.topk(k, dim=1, sorted=True):
the same columns in the same order for any magnitudes, ties, zeros, NaN and infinities included."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slowlink.algorithms import top_k as t


def _reference(magnitudes: torch.Tensor, k: int) -> torch.Tensor:
    return magnitudes.topk(k, dim=1, sorted=True).indices


@st.composite
def magnitudes(draw):
    """Rows of |values|: continuous, or drawn from a few levels (ties everywhere), with zero rows, NaN, inf."""
    rows, n = draw(st.integers(1, 5)), draw(st.sampled_from([64, 1024, 2048, 4096, 64 * 33]))
    k = draw(st.sampled_from([1, 8, 16, 32, 64]))
    generator = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = np.abs(generator.standard_normal((rows, n))).astype(np.float32)
    if draw(st.booleans()):
        x = np.round(x * draw(st.sampled_from([1, 4, 64]))).astype(np.float32)  # few levels: ties
    for _ in range(draw(st.integers(0, 3))):
        row, column = draw(st.integers(0, rows - 1)), draw(st.integers(0, n - 1))
        x[row, column] = draw(st.sampled_from([np.nan, np.inf, 0.0, 1e30]))
    if draw(st.booleans()):
        x[draw(st.integers(0, rows - 1))] = 0.0  # a chunk of a tensor without a gradient
    return torch.from_numpy(x), k


@settings(max_examples=200, deadline=None, derandomize=True)
@given(magnitudes())
def test_the_fast_top_k_is_torch_topk_bit_for_bit(case):
    x, k = case
    assert torch.equal(t.top_k_indices(x, k), _reference(x, k))


def test_the_fast_path_is_taken_and_leaves_few_candidates_on_dct_like_rows():
    # Large coefficients first, as a DCT's low frequencies: the shape a momentum's chunks have
    x = (
        torch.randn(204, 4096, generator=torch.Generator().manual_seed(0)).abs()
        / torch.arange(1, 4097) ** 0.5
    )
    slices = t._split(4096, 32)
    assert slices == 64
    _, _, counts = t._candidates(x.numpy(), t._lower_bound(x, slices, 32))
    assert counts.min() >= 32 and counts.mean() < 4 * 32  # a bound below the 32nd, and not far below
    assert torch.equal(t.top_k_indices(x, 32), _reference(x, 32))


def test_rows_the_candidates_cannot_order_are_picked_from_the_whole_row():
    x = torch.rand(6, 4096, generator=torch.Generator().manual_seed(1))
    x[1] = 0.0  # every value tied
    x[2, :40] = 5.0  # a tie across the 32nd place
    x[3, 7] = float("nan")  # torch.topk counts NaN as the largest
    x[4, :32] = torch.arange(32.0) + 10  # distinct top 32, then a tie below: still the fast answer
    assert torch.equal(t.top_k_indices(x, 32), _reference(x, 32))
