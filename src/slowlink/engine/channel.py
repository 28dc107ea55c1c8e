"""How messages travel between nodes, as the driver sees it: contributions go out, commits come in.

The mailbox protocol (protocol/courier.py) is one channel and the simulator (sim/) another. A channel
owns a published contribution's arrays from then on: it may turn the snapshot into Δ in place. It reads
them no more once it has delivered a commit of their round or a newer one: the node then clones a later
snapshot (of this fragment, or of another of the same shapes) into the same tensors.
"""

from dataclasses import dataclass
from typing import Protocol

from ..arrays import Arrays


@dataclass
class Contribution:
    """A snapshot of one fragment and what it trained since its anchor."""

    fragment: int
    step: int  # the node's local step at the snapshot
    base: int  # the commit version the snapshot's anchor is
    anchor: Arrays
    snapshot: Arrays
    steps: int
    samples: int
    final: bool
    step_seconds: float
    prepared: tuple[bytes, dict] | None = None  # (payload, its record) once encoded: a retry resends them


@dataclass(frozen=True)
class Arrival:
    """A fragment's newer commit; `mine` says what became of this node's contribution awaiting it:
    "merged", "rejected" (the commit names it rejected, for `rejected`, the merger's reason), "missed"
    (late), or None if there was none."""

    fragment: int
    version: int
    params: Arrays
    mine: str | None
    rejected: str | None = None


@dataclass(frozen=True)
class Refused:
    """A contribution the channel did not publish, and why; its steps stay with the node."""

    fragment: int
    round: int
    reason: str


class Channel(Protocol):
    failure: BaseException | None  # a bug on the channel's side, raised on the training thread

    def publish(self, contribution: Contribution) -> None: ...

    def arrivals(self) -> list[Arrival | Refused]:
        """What has arrived since the last call, without waiting."""
        ...

    def gather(self, deadline: float) -> Arrival | Refused | None:
        """Wait for the next arrival until `deadline` on the node's clock; None if none came."""
        ...

    def live_nodes(self) -> set[str]: ...

    def newest(self) -> list[int]:
        """The newest commit of each fragment this node has heard of (it may not hold them yet)."""
        ...
