"""How a per-step method (DeMo) meets the other nodes: every node's coefficients, gathered. The seam between
the method and the channel, like channel.py for the round-based methods: torch.distributed (collective/),
the mailbox and the simulator each implement it; SingleNode is the one that needs no channel.
"""

from typing import Protocol

import torch


class CoefficientExchange(Protocol):
    """An all-gather of one fixed-size pair of tensors per node, in rank order (this node's row included)."""

    @property
    def nodes(self) -> int: ...

    def all_gather(self, indices: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices (nodes, n), values (nodes, n)) from this node's (n,) indices and (n,) values."""
        ...


class SingleNode:
    """One node alone: the gathered rows are its own."""

    nodes = 1

    def all_gather(self, indices: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return indices[None], values[None]
