"""Partitions: which parameter tensors form each fragment.

Strided (Streaming DiLoCo §2.1): every tensor outside a transformer block (embeddings, final norm,
head) forms fragment 0, and block ℓ goes to fragment 1 + ℓ mod (Q−1), so early layers are never all
synced together. BalancedBytes (Decoupled DiLoCo §3): greedy bin-packing, largest tensor first, into
the lightest fragment. Both are deterministic in the schema alone, so every node computes the same plan.
"""

import re
from dataclasses import dataclass

from ..errors import ConfigError

# (name, shape, dtype) of each parameter, in the model's order.
Schema = list[tuple[str, tuple[int, ...], str]]

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def tensor_bytes(shape: tuple[int, ...], dtype: str) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count * _DTYPE_BYTES.get(dtype, 4)


@dataclass(frozen=True)
class BalancedBytes:
    """Pack tensors into `fragments` groups of nearly equal bytes."""

    def to_dict(self) -> dict:
        return {"name": "BalancedBytes"}

    def plan(self, schema: Schema, fragments: int) -> list[list[str]]:
        loads = [0] * fragments
        groups: list[list[str]] = [[] for _ in range(fragments)]
        by_size = sorted(schema, key=lambda spec: (-tensor_bytes(spec[1], spec[2]), spec[0]))
        for name, shape, dtype in by_size:
            lightest = loads.index(min(loads))
            groups[lightest].append(name)
            loads[lightest] += tensor_bytes(shape, dtype)
        return _in_model_order(groups, schema)

    def fewer(self, plan: list[list[str]]) -> str:
        """Why `plan` has fewer fragments than asked."""
        return f"the model has {sum(map(len, plan))} tensors to synchronize"


@dataclass(frozen=True)
class Strided:
    """Deal transformer blocks round the fragments; tensors outside blocks form fragment 0.

    block_pattern: a regex whose first group is the block index in a parameter name.
    """

    block_pattern: str = r"\.(\d+)\."

    def __post_init__(self) -> None:
        try:
            compiled = re.compile(self.block_pattern)
        except re.error as error:
            raise ConfigError(
                f"Strided(block_pattern=r'{self.block_pattern}') is not a regex: {error}"
            ) from None
        if compiled.groups < 1:
            raise ConfigError(
                f"Strided(block_pattern=r'{self.block_pattern}') needs one group capturing the block index, "
                r"e.g. r'\.(\d+)\.'"
            )

    def to_dict(self) -> dict:
        return {"name": "Strided", "block_pattern": self.block_pattern}

    def plan(self, schema: Schema, fragments: int) -> list[list[str]]:
        pattern = re.compile(self.block_pattern)
        blocks = {name: int(m.group(1)) for name, _, _ in schema if (m := pattern.search("." + name))}
        if fragments == 1 or not blocks:
            return BalancedBytes().plan(schema, fragments)
        groups: list[list[str]] = [[] for _ in range(fragments)]
        block_ids = sorted(set(blocks.values()))
        for name, _, _ in schema:
            if name in blocks:
                groups[1 + block_ids.index(blocks[name]) % (fragments - 1)].append(name)
            else:
                groups[0].append(name)
        return [group for group in groups if group]

    def fewer(self, plan: list[list[str]]) -> str:
        """Why `plan` has fewer fragments than asked."""
        pattern = re.compile(self.block_pattern)
        blocks = {int(m.group(1)) for group in plan for name in group if (m := pattern.search("." + name))}
        if not blocks:
            return BalancedBytes().fewer(plan)
        outside = sum(1 for group in plan for name in group if not pattern.search("." + name))
        rest = f"{outside} tensors outside them, for fragment 0" if outside else "no tensor outside them"
        return (f"Strided found {len(blocks)} blocks (block_pattern=r'{self.block_pattern}') and {rest}; "
                "a block goes whole into one fragment")  # fmt: skip


def _in_model_order(groups: list[list[str]], schema: Schema) -> list[list[str]]:
    order = {name: i for i, (name, _, _) in enumerate(schema)}
    return [sorted(group, key=order.__getitem__) for group in groups if group]
