"""Leases: each node rewrites nodes/<node>.json every beat, and reads the others' to know who is live.

A lease is live while the beat it holds keeps rising, judged on this observer's monotonic clock, never by
comparing wall clocks; a lease rewritten with old content (a replay) or junk does not count. `Leases` is a
node's side of it: its own beat, and its view of the others, read a quarter lease apart (or when asked).
"""

import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import ConfigError, MailboxError, MailboxUnavailable, PayloadError
from ..events import Event
from ..mailbox.contract import Mailbox
from . import keys, records

LIVES_REMEMBERED = 8  # lives of one node id whose beats are tracked: a replay of an old life stays stale
PAST_REMEMBERED = 1024  # leases gone from the listing whose beats are still remembered


MAX_BEAT_SECONDS = 5.0  # a second process under a live node's id sees its lease change within one beat


def beat_seconds(lease_seconds: float) -> float:
    """How often a node rewrites its lease: a quarter lease, so that readers, who read each lease a quarter
    lease apart, always see a beat rise well within the lease; at most MAX_BEAT_SECONDS, so that a second
    process under the same node id (refuse_if_live), watching for a beat and a half, sees a live node's
    lease change soon, and `slowlink status` (which shows what the leases say) is never far behind."""
    return min(lease_seconds / 4, MAX_BEAT_SECONDS)


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
        try:
            beat, etag = _lease_beat(mailbox, key, etag)
        except MailboxUnavailable:  # one look lost to a flaky store: the next looks still watch the beat
            continue
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


class Leases:
    """This node's lease and its view of the others'. `beat` rewrites its own; `observe` lists nodes/ and
    reads the leases whose content changed; `live()` names the nodes seen live (this one included)."""

    def __init__(self, mailbox: Mailbox, node_id: str, lease_seconds: float, clock: Callable[[], float],
                 emit: Callable[[Event], None]) -> None:  # fmt: skip
        self.mailbox, self.node_id, self.lease_seconds, self.clock, self.emit = (
            mailbox,
            node_id,
            lease_seconds,
            clock,
            emit,
        )
        self.liveness = Liveness(lease_seconds, clock)
        self.life = os.urandom(8).hex()  # tells this life's beats from an earlier one's under the same id
        self.beats = 0
        self.beaten_at = self.observed_at = float("-inf")
        self.reads = 0  # full reads of nodes/ so far: what session.batch_size waits on after joining
        self.most_live = 1  # the most nodes seen live at once, this one included (a merger's membership)

    def beat(self, status: dict) -> None:
        """Rewrite this node's lease with a higher beat and `status` (step, samples, versions, ...)."""
        self.beats += 1
        lease = {"node": self.node_id, "beat": self.beats, **status, "life": self.life, **writer(),
                 "written": round(self.mailbox.clock(), 3)}  # fmt: skip
        self.mailbox.put(keys.node(self.node_id), records.encode(lease))
        self.beaten_at = self.clock()

    def observe(self, *, sweep: bool) -> None:
        """List nodes/, then read the leases whose content changed: a node is live while its beat rises.
        Keys slowlink does not write, and leases that fail their checks, count for nothing. sweep: delete
        the leases silent for two leases (the leader does, so the store does not fill with the dead)."""
        present = {}
        for item in self.mailbox.list(keys.NODES):
            node = keys.parse_node(item.key)
            if node is None or node == self.node_id:
                continue
            present[item.key] = item.etag
            if self.liveness.due(item.key, item.etag):
                try:
                    beat = self._read(item.key, node)
                except MailboxError:
                    continue  # read again on the next look
                self.liveness.observe(item.key, item.etag, beat)
        self.liveness.forget_absent(present)
        self.most_live = max(self.most_live, len(self.live()))
        self.observed_at = self.clock()
        self.reads += 1
        if sweep and (gone := self.liveness.gone_for(2 * self.lease_seconds)):
            self.mailbox.delete(gone)
            self.liveness.forget_absent(set(present) - set(gone))
            self.emit(Event("leases_swept", self.node_id, f"deleted {len(gone)} lease(s) silent for two leases: "
                            f"{', '.join(gone[:5])}", {"keys": gone}))  # fmt: skip

    def live(self) -> set[str]:
        live = {key.removeprefix(keys.NODES).removesuffix(".json") for key in self.liveness.live_keys()}
        return live | {self.node_id}

    def _read(self, key: str, node: str) -> tuple[str, int] | None:
        try:
            found = self.mailbox.get(key, max_bytes=records.READ_LIMIT)
            if found is None or found.data is None:
                return None
            record = records.decode(found.data, records.LEASE_FIELDS, what=key)
            if record["node"] != node:
                raise PayloadError(f"{key} names node {record['node']!r}")
            life = record.get("life", "")
            if not isinstance(life, str):
                raise PayloadError(f"{key} field 'life' is not a string")
            return life, record["beat"]
        except PayloadError as error:
            self.emit(Event("lease_ignored", self.node_id, f"{key} counts for no live node: {error}",
                            {"key": key, "reason": str(error)}))  # fmt: skip
            return None
