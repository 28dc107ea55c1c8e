"""The simulator's peer exchange for gossip methods: values published on a worker's virtual clock reach its
group members after the network's modelled transfer (network.py): a pair swaps in T_pair(S), a larger group
all-reduces in T_AR(S); each worker's link sends one message at a time, in the order given, and an exchange
is over when both ends have sent their part. The scheduler (gossip.py) only lets a
worker collect once every partner has published or can no longer do so before the deadline.
"""

from collections import Counter
from dataclasses import dataclass, field

from ..algorithms.gossip import START
from ..arrays import Arrays
from ..clock import VirtualClock
from ..engine.peers import LATE, LEFT
from .network import Network


@dataclass
class SimBoard:
    """Every published value by (round, carries, rank) with its publication time; who has left; the bytes
    each worker sent and received, blocking (Δ) and non-blocking (starts) apart."""

    network: Network
    nodes: int
    clocks: list[VirtualClock]
    published: dict[tuple[int, str, int], tuple[Arrays, float]] = field(default_factory=dict)
    left: set[int] = field(default_factory=set)
    sent: list[Counter] = field(init=False)
    received: list[Counter] = field(init=False)
    forgotten: list[int] = field(init=False)
    link_free: list[float] = field(init=False)  # when each worker's link has sent all it was given

    def __post_init__(self) -> None:
        self.forgotten = [0] * self.nodes
        self.link_free = [0.0] * self.nodes
        self.sent = [Counter() for _ in range(self.nodes)]
        self.received = [Counter() for _ in range(self.nodes)]

    def transfer_seconds(self, group: tuple[int, ...], nbytes: int) -> float:
        if len(group) == 2:
            return self.network.pairwise_seconds(group[0], group[1], nbytes)
        return self.network.allreduce_seconds(list(group), nbytes)

    def decidable(
        self, rank: int, round_: int, carries: str, group: tuple[int, ...], deadline: float
    ) -> bool:
        """Whether a collect's answer is known now: every partner published, left, or is past the deadline."""
        return all(
            (round_, carries, other) in self.published
            or other in self.left
            or self.clocks[other].now() >= deadline
            for other in group
            if other != rank
        )

    def forget(self, rank: int, before: int) -> None:
        """`rank` collects no round before `before` again; values every live worker is done with go."""
        self.forgotten[rank] = before
        oldest = min((r for w, r in enumerate(self.forgotten) if w not in self.left), default=before)
        for key in [key for key in self.published if key[0] < oldest]:
            del self.published[key]


def _nbytes(arrays: Arrays) -> int:
    return sum(int(values.size) * 4 for values in arrays.values())  # float32 on the wire


class SimPeers:
    """One worker's side of the board, on its virtual clock."""

    def __init__(self, board: SimBoard, rank: int, clock: VirtualClock) -> None:
        self.board, self.rank, self.clock = board, rank, clock
        self.nodes = board.nodes
        self.failure: BaseException | None = None

    def publish(self, round_: int, carries: str, group: tuple[int, ...], arrays: Arrays) -> None:
        # One link per worker, first come first served: a message goes out once the link has sent the ones
        # before it (a Mix2 queues behind a Mix1 still on its way), and it has gone when its transfer is done.
        size, n = _nbytes(arrays), len(group)
        starts = max(self.clock.now(), self.board.link_free[self.rank])
        done = starts + self.board.transfer_seconds(group, size)
        self.board.link_free[self.rank] = done
        self.board.published[(round_, carries, self.rank)] = (arrays, done)
        moved = size if n == 2 else round(2 * (n - 1) / n * size)
        kind = "non_blocking" if carries == START else "blocking"
        self.board.sent[self.rank][kind] += moved
        self.board.received[self.rank][kind] += moved

    def collect(
        self, round_: int, carries: str, group: tuple[int, ...], deadline: float
    ) -> dict[int, Arrays | str]:
        own = self.board.published.get((round_, carries, self.rank))
        mine_done = own[1] if own is not None else self.clock.now()
        out: dict[int, Arrays | str] = {}
        until = self.clock.now()
        for other in group:
            if other == self.rank:
                continue
            entry = self.board.published.get((round_, carries, other))
            if entry is None:
                out[other] = LEFT if other in self.board.left else LATE  # it publishes after the deadline
                if other not in self.board.left:
                    until = max(until, deadline)
                continue
            arrays, theirs_done = entry
            arrives = max(mine_done, theirs_done)  # a swap, or a ring, is over when both ends' parts are
            if arrives <= deadline:
                out[other], until = arrays, max(until, arrives)
            else:
                out[other], until = LATE, max(until, deadline)
        self.clock.advance(max(0.0, until - self.clock.now()))
        return out

    def forget(self, before: int) -> None:
        self.board.forget(self.rank, before)
