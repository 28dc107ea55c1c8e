"""Liveness of leases and the election of the one node that merges rounds.

A lease is live while the beat it holds keeps rising, judged on this observer's monotonic clock, never by
comparing wall clocks; a lease rewritten with old content (a replay) or junk does not count. leader.json
carries a term that never goes back: it is taken create-once when absent, and taken over by
compare-and-swap once no newer (term, beat) has appeared for `lease_seconds`; the leader renews it by
compare-and-swap too, and overwrites a stale record (an older term replayed) instead of giving way to it.
"""

import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import ConfigError, PayloadError, PreconditionFailed
from ..mailbox.contract import Mailbox
from . import keys, records

LIVES_REMEMBERED = 8  # lives of one node id whose beats are tracked: a replay of an old life stays stale
PAST_REMEMBERED = 1024  # leases gone from the listing whose beats are still remembered


def beat_seconds(lease_seconds: float) -> float:
    """How often a node rewrites its lease: often enough that a quarter lease always sees a new beat, and
    that `slowlink status`, watching for a couple of seconds, sees a live node's lease change."""
    return min(lease_seconds / 4, 2.0)


@dataclass
class _Lease:
    beats: dict[str, int]  # life -> highest beat read from it
    rose_at: float | None  # when a beat last rose, on this observer's clock
    seen_at: float  # when this observer first listed the key
    read: tuple[str, float] | None = None  # (etag, when) of the last read


class Liveness:
    """Tracks when each lease's beat last rose, as this node reads it.

    The caller lists nodes/ and, for each key `due(key, etag)` names, reads the lease and reports its
    (life, beat) with `observe` (None when it is unreadable). Reads of one key are spaced at least a
    quarter lease apart, so following N nodes costs about 4·N reads per lease, whatever the beat rate."""

    def __init__(self, lease_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_seconds = lease_seconds
        self.read_interval = lease_seconds / 4
        self.clock = clock
        self._leases: dict[str, _Lease] = {}
        self._past: dict[
            str, dict[str, int]
        ] = {}  # key -> beats of each life, for keys gone from the listing

    def due(self, key: str, etag: str) -> bool:
        lease = self._leases.get(key)
        if lease is None or lease.read is None:
            return True
        last_etag, read_at = lease.read
        return last_etag != etag and self.clock() - read_at >= self.read_interval

    def observe(self, key: str, etag: str, beat: tuple[str, int] | None) -> None:
        now = self.clock()
        if key not in self._leases:
            self._leases[key] = _Lease(self._past.pop(key, {}), None, now)
        lease = self._leases[key]
        lease.read = (etag, now)
        if beat is None:
            return
        life, value = beat
        if value > lease.beats.get(life, -1):
            lease.beats[life] = value
            lease.rose_at = now
            while len(lease.beats) > LIVES_REMEMBERED:
                del lease.beats[next(iter(lease.beats))]

    def forget_absent(self, present: Iterable[str]) -> None:
        """Keys absent from a full listing are gone (a node that left cleanly, or a swept lease). Their
        beats are remembered, so that the same lease written back later is a replay, not a new node."""
        keep = set(present)
        for key in [key for key in self._leases if key not in keep]:
            self._past[key] = self._leases.pop(key).beats
            while len(self._past) > PAST_REMEMBERED:
                del self._past[next(iter(self._past))]

    def is_live(self, key: str) -> bool:
        lease = self._leases.get(key)
        return (
            lease is not None
            and lease.rose_at is not None
            and self.clock() - lease.rose_at < self.lease_seconds
        )

    def gone_for(self, seconds: float) -> list[str]:
        """Keys still listed whose beat has not risen (or never did) for `seconds`: leases left behind by
        nodes that crashed, or junk; a leader sweeps them so the store does not fill with the dead."""
        now = self.clock()
        return sorted(key for key, lease in list(self._leases.items())
                      if now - (lease.rose_at if lease.rose_at is not None else lease.seen_at) >= seconds)  # fmt: skip

    def live_keys(self) -> list[str]:
        # A copy first: the communication thread adds keys while the training thread asks.
        return sorted(key for key in list(self._leases) if self.is_live(key))


def refuse_if_live(
    mailbox: Mailbox,
    node_id: str,
    lease_seconds: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Refuse to start a node under an id another live process holds. With a lease already under this id,
    written on this machine by a process that is gone, that process crashed: this one replaces it at
    once. Otherwise watch the lease for one and a half beats: a beat that rises is another process beating
    it, and this node must not share its id (both would send contributions and leases as one); a lease that
    stays still is an earlier life of this node, crashed, which this one replaces."""
    key = keys.node(node_id)
    first, etag = _lease_beat(mailbox, key, None)
    if first is None or _written_by_a_gone_process(first):
        return
    interval = beat_seconds(lease_seconds)
    deadline = clock() + 1.5 * interval
    while clock() < deadline:
        sleep(min(0.5, interval / 8))
        beat, etag = _lease_beat(mailbox, key, etag)
        if beat is not None and (beat[0] != first[0] or beat[1] > first[1]):
            raise ConfigError(
                f"node_id={node_id!r} is live in another process: its lease in the mailbox is being renewed. "
                "Give every process of a run its own node_id (the default, host name and process id, is "
                "unique), or stop the other process first"
            )


def writer() -> dict:
    """What a lease says of the process writing it: its machine and process id."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _written_by_a_gone_process(beat: tuple[str, int, dict]) -> bool:
    host, pid = beat[2].get("host"), beat[2].get("pid")
    if host != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except OSError:
        return False  # it exists, under another user
    return False


def _lease_beat(
    mailbox: Mailbox, key: str, etag: str | None
) -> tuple[tuple[str, int, dict] | None, str | None]:
    """(life, beat, record) of the lease at `key` if it changed since `etag` and reads whole, and its etag."""
    try:
        found = mailbox.get(key, if_none_match=etag, max_bytes=records.READ_LIMIT)
        if found is None or found.data is None:
            return None, (found.etag if found is not None else etag)
        record = records.decode(found.data, records.LEASE_FIELDS, what=key)
    except PayloadError:
        return None, etag
    return (record.get("life", ""), record["beat"], record), found.etag


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
