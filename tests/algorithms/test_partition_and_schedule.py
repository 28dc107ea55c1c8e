"""Partitions and the staggered schedule (research/algorithms.md §2.1, §2.2)."""

import pytest

from slowlink import BalancedBytes, ConfigError, Strided
from slowlink.algorithms.partition import tensor_bytes
from slowlink.algorithms.schedule import due_fragments, fragment_offsets

SCHEMA = [
    ("tok_emb.weight", (256, 64), "float32"),
    ("blocks.0.attn.weight", (64, 64), "float32"),
    ("blocks.0.mlp.weight", (64, 256), "float32"),
    ("blocks.1.attn.weight", (64, 64), "float32"),
    ("blocks.1.mlp.weight", (64, 256), "float32"),
    ("blocks.2.attn.weight", (64, 64), "float32"),
    ("blocks.2.mlp.weight", (64, 256), "float32"),
    ("blocks.3.attn.weight", (64, 64), "float32"),
    ("blocks.3.mlp.weight", (64, 256), "float32"),
    ("norm_f.weight", (64,), "float32"),
]


def test_strided_puts_non_block_tensors_in_fragment_zero_and_deals_blocks_round_the_rest():
    plan = Strided().plan(SCHEMA, 3)
    assert plan[0] == ["tok_emb.weight", "norm_f.weight"]
    assert plan[1] == [
        "blocks.0.attn.weight",
        "blocks.0.mlp.weight",
        "blocks.2.attn.weight",
        "blocks.2.mlp.weight",
    ]
    assert plan[2] == [
        "blocks.1.attn.weight",
        "blocks.1.mlp.weight",
        "blocks.3.attn.weight",
        "blocks.3.mlp.weight",
    ]


def test_strided_with_more_fragments_than_blocks_leaves_out_the_empty_ones():
    plan = Strided().plan(SCHEMA, 8)
    assert len(plan) == 5 and all(plan)
    assert sorted(name for group in plan for name in group) == sorted(name for name, _, _ in SCHEMA)


def test_balanced_bytes_packs_fragments_to_nearly_equal_sizes_and_covers_every_tensor_once():
    plan = BalancedBytes().plan(SCHEMA, 3)
    sizes = {name: tensor_bytes(shape, dtype) for name, shape, dtype in SCHEMA}
    loads = [sum(sizes[name] for name in group) for group in plan]
    assert sorted(name for group in plan for name in group) == sorted(sizes)
    assert max(loads) - min(loads) <= max(sizes.values())
    assert plan == BalancedBytes().plan(SCHEMA, 3)  # deterministic in the schema alone


def test_strided_rejects_a_pattern_without_a_block_index_group():
    with pytest.raises(ConfigError, match="block_pattern"):
        Strided(block_pattern=r"blocks")


def test_the_papers_example_two_fragments_every_hundred_steps_sync_at_100_200_and_150_250():
    offsets = fragment_offsets(100, 2)
    syncs = {q: [t for t in range(1, 301) if q in due_fragments(t, 100, offsets)] for q in range(2)}
    assert syncs == {0: [100, 200, 300], 1: [150, 250]}


@pytest.mark.parametrize(("sync_every", "fragments"), [(12, 3), (10, 4), (7, 7), (5, 1)])
def test_every_fragment_syncs_once_per_h_steps_on_its_own_phase(sync_every, fragments):
    offsets = fragment_offsets(sync_every, fragments)
    for q in range(fragments):
        steps = [t for t in range(1, 10 * sync_every) if q in due_fragments(t, sync_every, offsets)]
        assert steps[0] == offsets[q] + sync_every  # only after H local steps
        assert all(b - a == sync_every for a, b in zip(steps, steps[1:], strict=False))
    for t in range(1, 10 * sync_every):
        assert len(due_fragments(t, sync_every, offsets)) <= 1  # never two fragments at once
