"""DeMo's faster paths pinned bit for bit to the definitions they replaced (algorithms/demo.py): the sparse
average's contributor counts in bytes against float counts, a scratch reused step after step against a fresh one, and the stack of rows-of-one chunks by one cat
against the chunk-by-chunk copy."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slowlink.algorithms import demo as d


def _average_with_float_counts(gathered: d.Sparse, chunk_numel: int) -> torch.Tensor:
    nodes, chunks, k = gathered.values.shape
    indices = gathered.indices.permute(1, 0, 2).reshape(chunks, nodes * k)
    values = gathered.values.permute(1, 0, 2).reshape(chunks, nodes * k)
    total = values.new_zeros(chunks, chunk_numel).scatter_add_(1, indices, values)
    counts = values.new_zeros(chunks, chunk_numel).scatter_add_(1, indices, torch.ones_like(values))
    return total.scatter_(1, indices, total.gather(1, indices) / counts.gather(1, indices))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sampled_from([1, 2, 5, 255, 256, 300]), st.integers(1, 4), st.integers(0, 2**31))
def test_the_contributors_average_is_the_float_count_definition(nodes, chunks, seed):
    generator = torch.Generator().manual_seed(seed)
    chunk_numel, k = 16, 5  # few coefficients a chunk: many nodes pick the same ones
    indices = torch.stack(
        [torch.randperm(chunk_numel, generator=generator)[:k] for _ in range(nodes * chunks)]
    )
    values = torch.randn(nodes, chunks, k, generator=generator)
    gathered = d.Sparse(indices.reshape(nodes, chunks, k), values)
    expected = _average_with_float_counts(gathered, chunk_numel)
    assert torch.equal(d.sparse_average(gathered, chunk_numel, "contributors"), expected)


def test_a_scratch_reused_step_after_step_averages_as_a_fresh_one():
    # The dense average and its counts live in the scratch from step to step: steps with other picks, other
    # node counts and both rules must each start from zeros.
    generator, chunk_numel, chunks, k = torch.Generator().manual_seed(7), 64, 3, 6
    scratch = d.Scratch()
    for step, (nodes, how) in enumerate([(4, "contributors"), (2, "all"), (3, "contributors"), (4, "all")]):
        indices = torch.stack(
            [torch.randperm(chunk_numel, generator=generator)[:k] for _ in range(nodes * chunks)]
        ).reshape(nodes, chunks, k)
        gathered = d.Sparse(indices, torch.randn(nodes, chunks, k, generator=generator))
        reused = d.sparse_average(gathered, chunk_numel, how, scratch)
        assert torch.equal(reused, d.sparse_average(gathered, chunk_numel, how)), f"step {step}"


def _stack_chunk_by_chunk(tensors: dict[str, torch.Tensor], group: d.Group) -> torch.Tensor:
    pieces = zip(group.names, group.layouts, strict=True)
    return torch.cat([d.to_chunks(tensors[name], layout).float() for name, layout in pieces])


def test_rows_of_one_stack_as_the_chunk_by_chunk_copy():
    generator = torch.Generator().manual_seed(3)
    tensors = {"a": torch.randn(128, generator=generator), "b": torch.randn(64, generator=generator)}
    tensors["c"] = torch.randn(256, generator=generator)[::2]  # a strided view
    (group,) = d.groups_of(tuple((name, tuple(t.shape)) for name, t in tensors.items()), 64)
    assert group.layouts[0].h == 1
    assert torch.equal(d.stack_chunks(tensors, group), _stack_chunk_by_chunk(tensors, group))
    mixed = tensors | {"b": tensors["b"].to(torch.bfloat16)}  # another dtype: copied into float32
    assert torch.equal(d.stack_chunks(mixed, group), _stack_chunk_by_chunk(mixed, group))
