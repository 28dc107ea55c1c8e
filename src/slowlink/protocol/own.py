"""A merger's own contributions: kept in its memory rather than written to their rounds, since it merges
them itself (one PUT and one GET fewer per round, and the merger uploads only its commits). They go to the
store when another node may need them: when it stops merging, and when a checkpoint counts them as sent."""

import threading

from ..mailbox.contract import Mailbox
from . import keys


class OwnContributions:
    def __init__(self, mailbox: Mailbox, node_id: str) -> None:
        self.mailbox, self.node_id = mailbox, node_id
        self.kept: dict[tuple[int, int], tuple[dict, bytes]] = {}  # (fragment, round) -> record, payload
        self.stored: set[tuple[int, int]] = set()  # those of them written to the store all the same
        self.wanted = threading.Event()  # a checkpoint waits for them to be stored (checkpoint/capture.py)

    def keep(self, record: dict, data: bytes) -> None:
        self.kept[(record["fragment"], record["round"])] = (record, data)

    def get(self, fragment: int, round_: int) -> tuple[dict, bytes] | None:
        return self.kept.get((fragment, round_))

    def forget(self, committed: list[int]) -> None:
        """Drop those whose rounds are committed (`committed`: each fragment's newest commit), by any merger."""
        for key in [key for key in self.kept if key[1] <= committed[key[0]]]:
            del self.kept[key]
            self.stored.discard(key)

    def store(self, head: list[int]) -> None:
        """Write those of rounds not yet committed, each once, as any node's; they stay kept for the merge."""
        for (fragment, round_), (_, data) in sorted(self.kept.items()):
            if round_ > head[fragment] and (fragment, round_) not in self.stored:
                self.mailbox.put(keys.contribution(fragment, round_, self.node_id), data)
                self.stored.add((fragment, round_))

    def hand_over(self, head: list[int]) -> None:
        """This node stops merging (it lost the lead, or leaves): they go to the store for the next merger."""
        self.store(head)
        self.kept.clear()
        self.stored.clear()

    def tend(self, head: list[int], leading: bool) -> None:
        """On each turn of the communication thread: hand them over once this node no longer leads, and store
        them when a checkpoint asks. A failed write raises, and the next turn tries again."""
        if self.kept and not leading:
            self.hand_over(head)
        if self.wanted.is_set():
            self.store(head)
            self.wanted.clear()
