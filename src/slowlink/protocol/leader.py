"""The election of the one node that merges rounds (leases.py says which nodes are live).

leader.json
carries a term that never goes back: it is taken create-once when absent, and taken over by
compare-and-swap once no newer (term, beat) has appeared for `lease_seconds`; the leader renews it by
compare-and-swap too, and overwrites a stale record (an older term replayed) instead of giving way to it.
"""

import time
from collections.abc import Callable

from ..errors import PayloadError, PreconditionFailed
from ..mailbox.contract import Mailbox
from . import keys, records


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
        self.term = 0  # the highest term seen; this node's own while it leads
        self._newest = (0, -1)  # the newest (term, beat) read: a record not above it is stale
        self._beat = 0
        self._etag: str | None = None
        self._changed_at = clock()
        self._renewed_at = 0.0

    def _record(self, term: int, node: str | None = None) -> bytes:
        self._beat += 1
        return records.encode(
            {"node": self.node_id if node is None else node, "term": term, "beat": self._beat}
        )

    def tick(self) -> str | None:
        """One look at leader.json. Returns "elected", "lost", or None when nothing changed for this node."""
        now = self.clock()
        if self.is_leader:
            return self._renew(now)
        try:
            found = self.mailbox.get(keys.LEADER, if_none_match=self._etag, max_bytes=records.READ_LIMIT)
            record = None
            if found is not None and found.data is not None:
                record = records.decode(found.data, records.LEADER_FIELDS, what=keys.LEADER)
        except PayloadError:
            return self._take_over_unreadable()
        if found is None:
            return self._take(if_absent=True)
        if record is not None:
            self._etag = found.etag
            if self._is_newer(record):
                self._changed_at = now
                # Vacant (released by a leader that left), or ours from an earlier life under the same node id.
                if record["node"] in ("", self.node_id):
                    return self._take(if_match=self._etag)
                return None
        if now - self._changed_at >= self.lease_seconds:
            return self._take(if_match=self._etag)
        return None

    def _is_newer(self, record: dict) -> bool:
        """Note a record read; True if its (term, beat) is above every one seen (a stale one is a replay)."""
        self.term = max(self.term, record["term"])
        if (record["term"], record["beat"]) <= self._newest:
            return False
        self._newest = (record["term"], record["beat"])
        self.leader = record["node"]
        return True

    def _renew(self, now: float) -> str | None:
        if now - self._renewed_at < self.lease_seconds / 4:
            return None
        try:
            self._etag = self.mailbox.put(keys.LEADER, self._record(self.term), if_match=self._etag)
        except PreconditionFailed:
            if not self._keep_after_refused_renewal():
                self.is_leader = False  # another node took over: we were too slow to renew
                return "lost"
        self._renewed_at = now
        return None

    def _keep_after_refused_renewal(self) -> bool:
        """A renewal refused for its etag. Three causes: an earlier renewal of ours landed with its answer
        lost (leader.json names this node in this term: adopt its etag); a newer term (a real takeover:
        give way); or a stale, junk or vanished record, which no honest node writes: write over it."""
        try:
            found = self.mailbox.get(keys.LEADER, max_bytes=records.READ_LIMIT)
            record = None
            if found is not None and found.data is not None:
                record = records.decode(found.data, records.LEADER_FIELDS, what=keys.LEADER)
        except PayloadError:
            if self._readable_on_second_look():
                return False  # the next tick reads it as any follower would
            return self._overwrite(self._listed_etag())
        if found is None:
            return self._overwrite(None)
        if record is None:
            return False
        if record["node"] == self.node_id and record["term"] == self.term:
            self._etag = found.etag
            return True
        if record["term"] > self.term:
            self._is_newer(record)
            return False
        return self._overwrite(found.etag)

    def _overwrite(self, etag: str | None) -> bool:
        try:
            self._etag = self.mailbox.put(
                keys.LEADER, self._record(self.term), if_absent=etag is None, if_match=etag
            )
            return True
        except PreconditionFailed:
            return False  # changed again meanwhile: give way, and read it like any follower

    def _take_over_unreadable(self) -> str | None:
        """leader.json fails its checks (unsigned or forged in a signed run, or garbled): it names nobody
        this node can trust, so take it over at once, by compare-and-swap on the etag a LIST shows. An
        answer cut short on its way fails them too, once: the record must fail a second read as well, or
        one bad answer would displace a live leader."""
        if self._readable_on_second_look():
            return None  # readable, or gone, on a second look: the next tick reads it as usual
        etag = self._listed_etag()
        if etag is None:
            return None
        self.leader, self._etag = None, etag
        return self._take(if_match=etag)

    def _readable_on_second_look(self) -> bool:
        try:
            again = self.mailbox.get(keys.LEADER, max_bytes=records.READ_LIMIT)
            if again is not None and again.data is not None:
                records.decode(again.data, records.LEADER_FIELDS, what=keys.LEADER)
            return True
        except PayloadError:
            return False

    def _listed_etag(self) -> str | None:
        etags = [listing.etag for listing in self.mailbox.list(keys.LEADER) if listing.key == keys.LEADER]
        return etags[0] if etags else None

    def _take(self, *, if_absent: bool = False, if_match: str | None = None) -> str | None:
        term = self.term + 1  # above every term seen: a takeover never goes back
        try:
            self._etag = self.mailbox.put(
                keys.LEADER, self._record(term), if_absent=if_absent, if_match=if_match
            )
        except PreconditionFailed:
            return None  # another node won; we will see its record on the next tick
        self.is_leader, self.leader, self.term = True, self.node_id, term
        self._newest = (term, self._beat)
        self._renewed_at = self._changed_at = self.clock()
        return "elected"

    def release(self) -> None:
        """Leave the leadership so another node takes it at once rather than after a lease."""
        if self.is_leader:
            self.is_leader = False
            try:
                # A newer beat in this term naming nobody: followers read it as fresh, and take it at once.
                self.mailbox.put(keys.LEADER, self._record(self.term, node=""), if_match=self._etag)
            except PreconditionFailed:
                pass
