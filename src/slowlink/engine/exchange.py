"""How a per-step method (DeMo) meets the other nodes: every node's bytes of a step, gathered. The seam between
the method and the channel, like channel.py for the round-based methods: torch.distributed (collective/gather.py),
a mailbox (collective/mailbox.py) and the simulator (sim/demo.py) each implement it; SingleNode needs no channel.
"""

from typing import Protocol


class CoefficientExchange(Protocol):
    """An all-gather of one payload per node and step, in rank order (this node's row included)."""

    @property
    def nodes(self) -> int: ...

    def all_gather(self, payload: bytes, *, step: int, max_bytes: int) -> list[bytes | None]:
        """Every node's payload of `step`, this node's own at its rank; None for a node whose payload did not
        come in time (an exchange that waits with a deadline). `max_bytes`: the most any node can send."""
        ...


class SingleNode:
    """One node alone: the gathered rows are its own."""

    nodes = 1

    def all_gather(self, payload: bytes, *, step: int, max_bytes: int) -> list[bytes | None]:
        del step, max_bytes
        return [payload]
