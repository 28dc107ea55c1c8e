"""DeMo's pure math (algorithms/demo.py) pinned to its definition, research/algorithms.md §6.1."""

import math

import pytest
import torch

from slowlink.algorithms import demo as d


def test_the_chunk_length_is_the_largest_divisor_not_above_chunk():
    assert d.layout_of((96, 40), 64)[3:] == (48, 40)
    assert d.layout_of((4096, 4096), 64)[3:] == (64, 64)
    assert d.layout_of((130,), 64)[3:] == (1, 26)  # 130 = 2·5·13: 65 is over 64, 26 the largest under
    assert d.layout_of((7, 3, 3), 64)[1:] == (7, 9, 7, 9)  # a conv weight: out × in·kh·kw
    assert d.layout_of((), 64)[1:] == (1, 1, 1, 1)


def test_the_dct_matrix_is_the_orthonormal_dct_ii():
    c = d.dct_matrix(8)
    assert torch.allclose(c @ c.T, torch.eye(8, dtype=torch.float64), atol=1e-14)
    # C[k, j] = √(2/N)·c_k·cos(π(2j+1)k/2N), c_0 = 1/√2: row 0 is constant 1/√N
    assert torch.allclose(c[0], torch.full((8,), 1 / math.sqrt(8), dtype=torch.float64))
    assert c[2, 3].item() == pytest.approx(math.sqrt(2 / 8) * math.cos(math.pi * 7 * 2 / 16), abs=1e-15)


@pytest.mark.parametrize("transform", d.TRANSFORMS)
@pytest.mark.parametrize("shape", [(96, 40), (128, 64), (130,), (6, 2, 5)])
def test_every_transform_round_trips_and_keeps_the_energy(transform, shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    layout = d.layout_of(shape, 64)
    basis = d.basis_of(layout, transform, seed=3, step=5, like=x)
    coefficients = d.forward(x, layout, basis)
    assert coefficients.shape == (layout.chunks, layout.chunk_numel)
    assert (d.inverse(coefficients, layout, basis) - x).abs().max() <= 1e-6 * x.abs().max()
    assert coefficients.square().sum().item() == pytest.approx(x.square().sum().item(), rel=1e-6)


def test_each_chunk_is_transformed_on_its_own():
    x = torch.zeros(128, 128)
    x[64:, :64] = torch.randn(64, 64, generator=torch.Generator().manual_seed(2))  # chunk (1, 0) only
    layout = d.layout_of(x.shape, 64)
    coefficients = d.forward(x, layout, d.basis_of(layout, "dct", seed=0, step=0, like=x))
    assert [bool(row.abs().max() > 0) for row in coefficients] == [False, False, True, False]
    # the DC coefficient of a chunk is its sum / √(h·w)
    assert coefficients[2, 0].item() == pytest.approx(x[64:, :64].sum().item() / 64, rel=1e-5)


def test_random_transforms_are_the_same_for_a_step_and_differ_across_steps():
    layout = d.layout_of((64, 64), 64)
    like = torch.zeros(1)
    first = d.basis_of(layout, "random", seed=7, step=3, like=like)
    again = d.basis_of(layout, "random", seed=7, step=3, like=like)
    other = d.basis_of(layout, "random", seed=7, step=4, like=like)
    assert torch.equal(first.rows, again.rows) and torch.equal(first.cols, again.cols)
    assert not torch.allclose(first.rows, other.rows) and not torch.allclose(first.rows, first.cols)


def test_top_k_keeps_the_largest_magnitudes_of_each_chunk_with_chunk_local_indices():
    coefficients = torch.tensor([[0.1, -5.0, 2.0, 0.3], [4.0, 0.0, -0.5, -6.0]])
    picked = d.top_k(coefficients, 2)
    assert picked.indices.tolist() == [[1, 2], [3, 0]]
    assert picked.values.tolist() == [[-5.0, 2.0], [-6.0, 4.0]]
    assert d.top_k(coefficients, 9).indices.shape == (2, 4)  # k above the chunk: all of it


def test_the_sparse_average_divides_by_contributors_or_by_all_nodes():
    # two nodes, one chunk of 4: node 0 sends {0: 2, 1: 4}, node 1 sends {1: 8, 3: 6}
    gathered = d.Sparse(torch.tensor([[[0, 1]], [[1, 3]]]), torch.tensor([[[2.0, 4.0]], [[8.0, 6.0]]]))
    assert d.sparse_average(gathered, 4, "contributors").tolist() == [[2.0, 6.0, 0.0, 6.0]]
    assert d.sparse_average(gathered, 4, "all").tolist() == [[1.0, 6.0, 0.0, 3.0]]


def test_quantized_values_lie_on_their_grid():
    values = torch.tensor([[3.0, -1.2, 0.4], [-0.9, 0.2, 0.05]])
    two_bit = d.quantize(values, "2bit", "chunk")
    s = torch.tensor([[3.0], [0.8984375]])  # max|v| rounded to bf16 (0.9 → 0.8984375)
    levels = torch.tensor(d.TWO_BIT_LEVELS)
    assert torch.equal(two_bit, levels[torch.tensor([[3, 1, 2], [0, 2, 2]])] * s)
    assert d.quantize(values, "sign", "tensor").abs().unique().numel() == 1
    assert torch.equal(torch.signbit(d.quantize(values, "sign", "chunk")), torch.signbit(values))
    assert torch.equal(d.quantize(values, "bf16"), values.to(torch.bfloat16).float())


def in_coefficients(momentum: dict[str, torch.Tensor], chunk: int, step: int = 0) -> d.DeMoState:
    """A DeMoState holding these tensors' momentum (in the tensors' own space) as the DCT's coefficients."""
    groups = d.groups_of_tensors(momentum, chunk)
    like = next(iter(momentum.values()))
    stacks = tuple(
        d.forward_blocks(
            d.stack_chunks(momentum, g), d.basis_of(g.layouts[0], "dct", seed=0, step=0, like=like)
        )
        for g in groups
    )
    return d.DeMoState(stacks, step, groups)


def in_space(state: d.DeMoState) -> dict[str, torch.Tensor]:
    """The momentum of each tensor, in its own space: the inverse DCT of the state's coefficients."""
    out = {}
    for group, stack in zip(state.groups, state.momentum, strict=True):
        basis = d.basis_of(group.layouts[0], "dct", seed=0, step=0, like=stack)
        pieces = d.inverse_blocks(stack, basis).split([layout.chunks for layout in group.layouts])
        out.update(
            {n: d.from_chunks(x, lay) for n, x, lay in zip(group.names, pieces, group.layouts, strict=True)}
        )
    return out


def test_compress_subtracts_exactly_what_was_sent():
    math_ = d.demo_math(compression_decay=0.9, topk=3, chunk=4, values="2bit")
    g = {"w": torch.randn(8, 4, generator=torch.Generator().manual_seed(4))}
    before = {"w": torch.randn(8, 4, generator=torch.Generator().manual_seed(5))}
    sent, after = math_.compress(g, in_coefficients(before, 4), {"w": 0.5})
    m = 0.9 * before["w"] + 0.5 * g["w"]
    layout = d.layout_of((8, 4), 4)
    basis = d.basis_of(layout, "dct", seed=0, step=0, like=m)
    (sent,) = sent  # one group: the one tensor
    removed = d.inverse(d.scatter(sent, layout.chunk_numel), layout, basis)
    assert torch.allclose(in_space(after)["w"], m - removed, atol=1e-6)
    # the coefficients left in m are the unsent ones: at the sent indices only the quantization error
    left = d.forward(in_space(after)["w"], layout, basis)
    full = d.forward(m, layout, basis)
    assert torch.allclose(left.gather(1, sent.indices), full.gather(1, sent.indices) - sent.values, atol=1e-5)
    unsent = torch.ones_like(full, dtype=torch.bool).scatter_(1, sent.indices, False)
    assert torch.allclose(left[unsent], full[unsent], atol=1e-5)


@pytest.mark.parametrize(
    "values, scale", [("f32", "tensor"), ("2bit", "tensor"), ("sign", "tensor"), ("2bit", "chunk")]
)
def test_tensors_of_one_chunk_shape_are_compressed_together_as_each_alone(values, scale):
    # Batched as one stack of chunks (the speed of a step), each tensor still gets its own scale, picks and
    # subtraction: the same as compressing it alone. A 1-d tensor has chunks of another shape: its own group.
    shapes = {"a": (128, 64), "b": (64, 192), "c": (64,), "d": (64, 64)}
    gen = torch.Generator().manual_seed(9)
    grads = {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    momentum = {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    math_ = d.demo_math(compression_decay=0.9, topk=8, chunk=64, values=values, value_scale=scale)
    sent, after = math_.compress(grads, in_coefficients(momentum, 64), dict.fromkeys(shapes, 0.5))
    groups = d.groups_of(tuple(shapes.items()), 64)
    assert [g.names for g in groups] == [("a", "b", "d"), ("c",)]
    directions, _ = math_.direction([d.Sparse(s.indices[None], s.values[None]) for s in sent], after)
    for name in shapes:
        alone, after_alone = math_.compress(
            {name: grads[name]}, in_coefficients({name: momentum[name]}, 64), {name: 0.5}
        )
        group = next(g for g in range(len(groups)) if name in groups[g].names)
        place = groups[group].names.index(name)
        start = sum(layout.chunks for layout in groups[group].layouts[:place])
        rows = slice(start, start + alone[0].indices.shape[0])
        assert torch.equal(sent[group].indices[rows].sort(1).values, alone[0].indices.sort(1).values)
        assert torch.allclose(in_space(after)[name], in_space(after_alone)[name], atol=1e-5)
        one, _ = math_.direction([d.Sparse(alone[0].indices[None], alone[0].values[None])], after_alone)
        assert torch.equal(directions[group][rows], one[0])  # sign(u), chunk by chunk
