"""Liveness of leases and the election of the one node that merges rounds.

A lease is live while its content keeps changing, judged on this observer's monotonic clock, never by
comparing wall clocks. leader.json is taken create-once when absent and taken over by compare-and-swap
on the etag that stopped changing for `lease_seconds`; the leader renews it by compare-and-swap too,
so two nodes can never both believe they renewed the same term.
"""

import time
from collections.abc import Callable

from ..errors import PayloadError, PreconditionFailed
from ..mailbox.contract import Mailbox
from . import keys, records


class Liveness:
    """Tracks when each key's etag last changed, as seen by this node."""

    def __init__(self, lease_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_seconds = lease_seconds
        self.clock = clock
        self._seen: dict[str, tuple[str, float]] = {}

    def observe(self, key: str, etag: str) -> None:
        previous = self._seen.get(key)
        if previous is None or previous[0] != etag:
            self._seen[key] = (etag, self.clock())

    def observe_listing(self, present: dict[str, str]) -> None:
        """Record a full listing: keys absent from it are gone (a node that left cleanly)."""
        for key in list(self._seen):
            if key not in present:
                del self._seen[key]
        for key, etag in present.items():
            self.observe(key, etag)

    def is_live(self, key: str) -> bool:
        seen = self._seen.get(key)
        return seen is not None and self.clock() - seen[1] < self.lease_seconds

    def live_keys(self) -> list[str]:
        return sorted(key for key in self._seen if self.is_live(key))


class Leadership:
    """This node's view of leader.json; `tick()` renews, watches, or takes over, and says what changed."""

    def __init__(
        self,
        mailbox: Mailbox,
        node_id: str,
        lease_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mailbox = mailbox
        self.node_id = node_id
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.is_leader = False
        self.leader: str | None = None
        self.term = 0
        self._beat = 0
        self._etag: str | None = None
        self._changed_at = clock()
        self._renewed_at = 0.0

    def _record(self, term: int) -> bytes:
        self._beat += 1
        return records.encode({"node": self.node_id, "term": term, "beat": self._beat})

    def tick(self) -> str | None:
        """One look at leader.json. Returns "elected", "lost", or None when nothing changed for this node."""
        now = self.clock()
        if self.is_leader:
            if now - self._renewed_at < self.lease_seconds / 4:
                return None
            try:
                self._etag = self.mailbox.put(keys.LEADER, self._record(self.term), if_match=self._etag)
            except PreconditionFailed:
                if not self._renewal_landed():
                    self.is_leader = False  # another node took over: we were too slow to renew
                    return "lost"
            self._renewed_at = now
            return None
        try:
            found = self.mailbox.get(keys.LEADER, if_none_match=self._etag)
            if found is not None and found.data is not None:
                record = records.decode(found.data, records.LEADER_FIELDS, what=keys.LEADER)
                self.leader, self.term = record["node"], record["term"]
        except PayloadError:
            return self._take_over_unreadable()
        if found is None:
            return self._take(1, if_absent=True)
        if found.etag != self._etag:
            self._etag, self._changed_at = found.etag, now
            # Vacant (released by a leader that left), or ours from an earlier life under the same node id.
            if self.leader in ("", self.node_id):
                return self._take(self.term + 1, if_match=self._etag)
            return None
        if now - self._changed_at >= self.lease_seconds:
            return self._take(self.term + 1, if_match=self._etag)
        return None

    def _take_over_unreadable(self) -> str | None:
        """leader.json fails its checks (unsigned or forged in a signed run, or garbled): it names nobody
        this node can trust, so take it over at once, by compare-and-swap on the etag a LIST shows. An
        answer cut short on its way fails them too, once: the record must fail a second read as well, or
        one bad answer would displace a live leader."""
        try:
            again = self.mailbox.get(keys.LEADER)
            if again is not None and again.data is not None:
                records.decode(again.data, records.LEADER_FIELDS, what=keys.LEADER)
            return None  # readable, or gone, on a second look: the next tick reads it as usual
        except PayloadError:
            pass
        etags = [listing.etag for listing in self.mailbox.list(keys.LEADER) if listing.key == keys.LEADER]
        if not etags:
            return None
        self.leader, self._etag = None, etags[0]
        return self._take(self.term + 1, if_match=self._etag)

    def _renewal_landed(self) -> bool:
        """After a renewal refused for its etag: an earlier renewal of ours may have landed with its answer
        lost, moving the etag we hold. leader.json naming this node in this term is that write (a takeover
        names another node, and this node's restart a later term), so we adopt its etag and stay leader."""
        try:
            found = self.mailbox.get(keys.LEADER)
            if found is None or found.data is None:
                return False
            record = records.decode(found.data, records.LEADER_FIELDS, what=keys.LEADER)
        except PayloadError:
            return False  # unreadable: not our renewal
        if record["node"] != self.node_id or record["term"] != self.term:
            return False
        self._etag = found.etag
        return True

    def _take(self, term: int, *, if_absent: bool = False, if_match: str | None = None) -> str | None:
        try:
            self._etag = self.mailbox.put(
                keys.LEADER, self._record(term), if_absent=if_absent, if_match=if_match
            )
        except PreconditionFailed:
            return None  # another node won; we will see its record on the next tick
        self.is_leader, self.leader, self.term = True, self.node_id, term
        self._renewed_at = self._changed_at = self.clock()
        return "elected"

    def release(self) -> None:
        """Leave the leadership so another node takes it at once rather than after a lease."""
        if self.is_leader:
            self.is_leader = False
            try:
                self.mailbox.put(keys.LEADER, records.encode({"node": "", "term": self.term, "beat": -1}),
                                 if_match=self._etag)  # fmt: skip
            except PreconditionFailed:
                pass
