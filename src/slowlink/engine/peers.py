"""How a gossip method meets its partners: each node publishes its values for (round, carries), and gathers
its group's until a deadline. The seam between the gossip driver (gossip.py) and the channels, as channel.py
is for the round-based methods: the simulator (sim/peers.py), a mailbox (protocol/peers.py) and, later,
torch.distributed implement it; MemoryPeers (threads in one process) is the one tests use.
"""

import threading
from collections.abc import Callable
from typing import Protocol

from ..arrays import Arrays
from ..clock import REAL, Clock

# Why a partner's values are not in a mix (the node mixes with itself instead): counted and reported.
MISSING, LATE, LEFT = "missing", "late", "left"


class PeerExchange(Protocol):
    """rank: this node's place in the roster of `nodes`. publish hands the exchange a node's values (it
    owns them from then on; it never blocks). collect returns each partner's values, or why they are not
    here (a reason string), waiting at most until `deadline` on the node's clock (now: no wait)."""

    rank: int
    nodes: int
    failure: BaseException | None

    def publish(self, round_: int, carries: str, group: tuple[int, ...], arrays: Arrays) -> None: ...

    def collect(
        self, round_: int, carries: str, group: tuple[int, ...], deadline: float
    ) -> dict[int, Arrays | str]: ...

    def forget(self, before: int) -> None:
        """Rounds before `before` will not be collected again: their values may go."""
        ...


class Board:
    """The shared state of MemoryPeers: every published value by (round, carries, rank), and a condition
    that wakes collectors when one lands. `check(round, carries, rank, values)` may refuse a value (a
    reason), as a real channel refuses a payload that fails its checks."""

    def __init__(self, check: Callable[[int, str, int, Arrays], str | None] | None = None) -> None:
        self.values: dict[tuple[int, str, int], Arrays] = {}
        self.changed = threading.Condition()
        self.check = check


class MemoryPeers:
    """One node's side of a Board, for nodes that are threads of one process (real clock)."""

    def __init__(self, board: Board, rank: int, nodes: int, clock: Clock = REAL) -> None:
        self.board, self.rank, self.nodes, self.clock = board, rank, nodes, clock
        self.failure: BaseException | None = None

    def publish(self, round_: int, carries: str, group: tuple[int, ...], arrays: Arrays) -> None:
        del group  # every member reads the one copy
        with self.board.changed:
            self.board.values[(round_, carries, self.rank)] = arrays
            self.board.changed.notify_all()

    def collect(
        self, round_: int, carries: str, group: tuple[int, ...], deadline: float
    ) -> dict[int, Arrays | str]:
        wanted = [rank for rank in group if rank != self.rank]
        with self.board.changed:
            while not all((round_, carries, rank) in self.board.values for rank in wanted):
                left = deadline - self.clock.now()
                if left <= 0:
                    break
                self.board.changed.wait(min(left, 0.05))
            out: dict[int, Arrays | str] = {}
            for rank in wanted:
                values = self.board.values.get((round_, carries, rank))
                check = self.board.check
                refusal = check(round_, carries, rank, values) if values is not None and check else None
                out[rank] = refusal or (values if values is not None else MISSING)
        return out

    def forget(self, before: int) -> None:
        del before  # the board belongs to all its nodes; a test's run is short
