"""Noticing a node that trains alone: the store keeps failing and no commit has reached the node for a while.

A node whose uploads and polls fail goes on training from the last commit it applied, as it should through a
short outage; through a long one its steps only pile up. The watch hears every event the node emits and says
when that became a stall: no progress for STALL_ROUNDS rounds at the node's own step time (and for at least
STALL_POLLS polls), with at least STALL_FAILURES failures of the store since. Progress is a commit applied,
or the run's head moving on as the communication thread reads it (a node that pauses its training loop while
the others commit is not stalled). It says so once, until progress resumes.
"""

from collections.abc import Callable

from ..events import Event

STALL_ROUNDS = 3  # rounds of sync_every steps at the node's step time without a commit
STALL_POLLS = (
    20  # ... and never under this many polls of the communication thread (5 s at the default 0.25 s)
)
STALL_FAILURES = 3  # failures of the store since the last commit applied
FAILURE_KINDS = frozenset({"mailbox_error", "upload_failed"})


class StallWatch:
    """Fed every event a node emits (`heard`); returns the `stalled` event once a stall begins.

    sync_every: the method's H. step_seconds: the node's smoothed time between two steps, and head: the sum
    of the newest versions the node knows of, both read when a failure is heard. since: when the node
    joined, on `now`'s clock (progress is awaited from there)."""

    def __init__(
        self,
        node_id: str,
        *,
        sync_every: int,
        poll_seconds: float,
        step_seconds: Callable[[], float],
        head: Callable[[], int],
        since: float,
    ) -> None:
        self.node_id, self.sync_every, self.poll_seconds = node_id, sync_every, poll_seconds
        self.step_seconds, self.head = step_seconds, head
        self.since = since  # when progress was last seen, or the node joined
        self.seen_head = head()
        self.failures = 0  # of the store since then
        self.last_error = ""
        self.stalled = False

    def limit(self) -> float:
        """Seconds without a commit, failures going on, that make a stall."""
        return max(STALL_ROUNDS * self.sync_every * self.step_seconds(), STALL_POLLS * self.poll_seconds)

    def heard(self, event: Event, now: float) -> Event | None:
        if event.kind == "commit_applied":
            self.since, self.failures, self.stalled = now, 0, False
            return None
        if event.kind not in FAILURE_KINDS:
            return None
        if (head := self.head()) != self.seen_head:  # the run moved on, and this node heard of it
            self.since, self.failures, self.stalled, self.seen_head = now, 0, False, head
        self.failures += 1
        self.last_error = event.message
        quiet = now - self.since
        if self.stalled or self.failures < STALL_FAILURES or quiet < self.limit():
            return None
        self.stalled = True
        return Event(
            "stalled", self.node_id,
            f"no commit reached this node for {quiet:.1f} s while the store failed {self.failures} times (last: "
            f"{self.last_error}); this node trains alone from its last commit until the store answers again: "
            "check the store (endpoint, credentials, network, quota)",
            {"seconds": round(quiet, 3), "failures": self.failures, "error": self.last_error},
        )  # fmt: skip
