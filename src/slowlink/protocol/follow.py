"""How a node learns of new commits without reading head.json every turn: it probes the key of the next
commit of each fragment a contribution of its awaits (a missing key is one cheap 404), not before most of
the time its commits have taken lately, and a quarter lease apart reads head.json, a hint that names the newest
commits only every few (run.HEAD_EVERY), and probes past it where something may be new.
"""

import math
import statistics
from collections import deque
from collections.abc import Callable

from ..arrays import Arrays
from ..errors import PayloadError
from ..events import Event
from ..mailbox.contract import Mailbox
from . import keys
from .chain import apply_change, params_at
from .run import Run, read_commit, read_head

Deliver = Callable[[int, int, Arrays, dict], None]  # (fragment, version, parameters, commit record)
LATENCY_SHARE = 0.75  # an awaited commit is first looked for this share of its recent latency after sending
LATENCIES = 5  # recent latencies kept: their median, which one slow round does not move, is the estimate
# After a first look that misses, the next comes a quarter of the recent latency later, then each twice as
# long after the one before (at least MIN_GAP apart). Left to the courier's backoff, the next look came a
# poll or more later, which the latency then measured: rounds that took 0.2 s were seen after 0.6 s or so.
MIN_GAP = 0.02


class CommitFeed:
    def __init__(self, mailbox: Mailbox, run: Run, node_id: str, emit: Callable[[Event], None],
                 latest: dict[int, tuple[int, Arrays]], head: list[int], deliver: Deliver,
                 clock: Callable[[], float]) -> None:  # fmt: skip
        """latest: the commit each fragment holds (the Courier's, moved by `deliver`); head: the newest
        commit heard of per fragment, held or not, which this feed moves forward in place."""
        self.mailbox, self.run, self.node_id, self.emit = mailbox, run, node_id, emit
        self.latest, self.head, self.deliver, self.clock = latest, head, deliver, clock
        self.head_etag: str | None = None
        self.sent_at: dict[int, float] = {}  # fragment -> when this node's contribution awaiting it went out
        self.latencies: deque[float] = deque(maxlen=LATENCIES)  # seconds from sending to finding the commit
        self.looks: dict[int, tuple[int, float]] = {}  # fragment -> (looks since sending, when the last was)

    def latency(self) -> float:
        """The recent latency of this node's commits: the median of the last LATENCIES, 0 before any."""
        return statistics.median(self.latencies) if self.latencies else 0.0

    def sent(self, fragment: int) -> None:
        self.sent_at[fragment] = self.clock()
        self.looks.pop(fragment, None)

    def next_look_at(self, awaited: dict[int, object]) -> float:
        """When the next look for a commit awaited (`awaited`, by fragment) is due: LATENCY_SHARE of the
        recent latency after sending, then a quarter of it after a miss, doubling; inf if none is awaited."""
        latency = self.latency()
        times = []
        for fragment in awaited:
            if (sent_at := self.sent_at.get(fragment)) is None:
                continue
            count, last = self.looks.get(fragment, (0, sent_at))
            gap = max(MIN_GAP, latency / 4) * 2 ** (count - 1)
            times.append(sent_at + LATENCY_SHARE * latency if count == 0 else last + gap)
        return min(times, default=math.inf)

    def due(self, fragment: int) -> bool:
        """Whether to look for the commit this node's contribution to `fragment` awaits: at the times
        next_look_at names, so that a round that closes on time costs one GET, and a late one a few."""
        return fragment not in self.sent_at or self.clock() >= self.next_look_at({fragment: None})

    def overdue(self, awaited: dict[int, object], slack: float) -> bool:
        """Whether a commit one of this node's contributions awaits (`awaited`, by fragment) is later than
        twice the recent latency and `slack` seconds: then the merger may be gone."""
        latency = self.latency()
        now = self.clock()
        return any(now - self.sent_at.get(q, now) >= 2 * latency + slack for q in awaited)

    def poll_head(self, awaited: dict[int, object] | None) -> None:
        """head.json with a conditional GET, then each fragment: the commit it names, if this node is more
        than one behind it, and the commits after the newest held, up to the first key not there yet.
        awaited: this node's contributions awaiting their commits, by fragment (None for the merger, which
        commits them itself): their fragments are looked at, and all are when none awaits; any other, once
        head.json names a commit of it newer than the one held (it lags by fewer than HEAD_EVERY)."""
        try:
            versions, self.head_etag = read_head(self.mailbox, len(self.head), etag=self.head_etag)
        except PayloadError as error:  # the merger rewrites it from the commits; until then, go on without it
            self._failed(error)
            versions = None
        if versions is not None:
            self.head[:] = [max(old, new) for old, new in zip(self.head, versions, strict=True)]
        for fragment in range(len(self.head)):
            if self.head[fragment] > self.latest[fragment][0] + 1:  # far behind: straight to the hint
                try:
                    self.fetch(fragment, self.head[fragment])
                except PayloadError as error:  # a hint naming a commit that is not there: probe instead
                    self._failed(error)
            if awaited is not None and fragment in awaited:
                self.catch_up(fragment, awaited)
            elif awaited == {} or (versions is not None and versions[fragment] > self.latest[fragment][0]):
                self.catch_up(fragment)

    def catch_up(self, fragment: int, awaited: dict[int, object] | None = None) -> None:
        """Fetch the commits after the newest held until a key is not there yet; with `awaited` (the
        contributions awaiting their commit, by fragment), only while `fragment` is in it."""
        if awaited is not None and fragment in self.sent_at:
            self.looks[fragment] = (self.looks.get(fragment, (0, 0.0))[0] + 1, self.clock())
        try:
            while awaited is None or fragment in awaited:
                version = self.latest[fragment][0] + 1
                record = read_commit(self.mailbox, fragment, version)
                if record is None:
                    return
                self.fetch(fragment, version, record)
                if awaited is not None and fragment not in awaited and fragment in self.sent_at:
                    self.latencies.append(self.clock() - self.sent_at.pop(fragment))
        except PayloadError as error:  # this fragment waits for a readable commit; the others go on
            self._failed(error)

    def fetch(self, fragment: int, version: int, record: dict | None = None) -> None:
        """Rebuild commit `version` of `fragment` (its record, if already read) and deliver it."""
        if record is None and (record := read_commit(self.mailbox, fragment, version)) is None:
            raise PayloadError(f"{keys.commit(fragment, version)} is missing though head.json names it")
        self.head[fragment] = max(self.head[fragment], version)
        held_version, held = self.latest[fragment]
        params = None
        if record["change"] is not None and held_version == version - 1:
            try:  # the light way: the held parameters plus the commit's small change
                params = apply_change(self.mailbox, self.run, fragment, version, held, record)
            except PayloadError as error:
                self.emit(Event("commit_change_refused", self.node_id,
                                f"fragment {fragment} round {version}: {error}; rebuilding it from the newest snapshot",
                                {"fragment": fragment, "round": version, "reason": str(error)}))  # fmt: skip
        if params is None:
            params = params_at(self.mailbox, self.run, fragment, version, record)
        self.deliver(fragment, version, params, record)

    def _failed(self, error: PayloadError) -> None:
        self.emit(Event("mailbox_error", self.node_id, str(error), {"error": "PayloadError"}))
