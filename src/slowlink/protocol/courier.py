"""The mailbox channel: a node's communication thread, everything a session does with the mailbox after
joining (engine/channel.py is the interface it offers the driver).

Each turn it uploads queued contributions, probes for the commits its contributions await (follow.py:
head.json, a hint, a quarter lease apart, once a beat while none awaits), beats its lease, watches or renews the leadership, and, when it leads, tries to close each
fragment's next round. Turns come every poll_seconds while a round this node takes part in is open, a few
times less often otherwise; the lease is beaten a few times per lease, the leases and leader.json are read
every couple of seconds only where they are needed. It talks to the training thread through two queues
only: contributions in, alignments (new commits, and whether they hold this node's contribution) out.
"""

import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..algorithms.method import Method
from ..algorithms.robust import l2_norm
from ..arrays import Arrays, subtract_into
from ..clock import REAL, Clock
from ..engine.channel import Arrival, Contribution, Refused
from ..errors import MailboxError, PayloadError, TrainingDiverged
from ..events import Event
from ..mailbox.contract import Mailbox
from ..wire import payload
from ..wire.compress import compress
from ..wire.fragment import HostBuffer, encode_fragment
from . import contribution, keys
from .follow import CommitFeed
from .leader import Leadership
from .leases import Leases
from .leases import beat_seconds as beat_interval
from .leaving import leave
from .merger import Merger
from .own_norms import OwnNorms
from .run import Run, advance_head, probe_newest, read_commit

BACKOFF = 1.25  # each turn without news waits this much longer: news is seen late by at most a quarter
WATCH_SECONDS = 2.0  # staleness of leases to close a round early, of leader.json to wait; the longest pause
CLOSING_SECONDS = 0.1  # while the node leaves: how often it looks for the commits it waits for (closing())


@dataclass(frozen=True)
class NodeStatus:
    step: int
    samples: int
    step_seconds: float


class Courier:
    def __init__(self, mailbox: Mailbox, run: Run, method: Method, node_id: str,
                 latest: dict[int, tuple[int, Arrays]], *, emit: Callable[[Event], None],
                 status: Callable[[], NodeStatus], poll_seconds: float, lease_seconds: float,
                 compression: str | None, clock: Clock = REAL, beat_seconds: float | None = None,
                 on_device: Callable[[Arrays], dict] | None = None) -> None:  # fmt: skip
        """beat_seconds: how often the lease is renewed (default: a fraction of the lease, leader.py);
        on_device: brings a commit's parameters to the model's device."""
        self.mailbox, self.run, self.method, self.node_id = mailbox, run, method, node_id
        self.latest = latest  # fragment -> (version, params): the newest commit this node holds, on host
        self.emit, self.status, self.clock, self.on_device = emit, status, clock, on_device or dict
        self.wire = method.wire()
        self.encoding, self.compression = self.wire.delta_dtype or "F32", compression
        # Error feedback: fragment -> what this node's encoding has lost so far, and the residual after the
        # contribution in flight, which replaces it only once that contribution is merged.
        self.residual: dict[int, Arrays] = {}
        self.residual_in_flight: dict[int, Arrays] = {}
        self.buffer = HostBuffer()  # where contributions encoded on the device come to host
        self.poll_seconds, self.lease_seconds = poll_seconds, lease_seconds
        self.beat_seconds = beat_seconds if beat_seconds is not None else beat_interval(lease_seconds)
        self.watch_seconds = self.overdue_slack = self.look_seconds = min(self.beat_seconds, WATCH_SECONDS)
        # Reading every lease a quarter lease apart keeps each live one seen rising within a lease.
        self.observe_seconds = max(self.beat_seconds, lease_seconds / 4)
        self._syncs_every = method.rounds(len(run.plan)).sync_every / len(run.plan)  # steps between syncs
        self._quiet_turns, self._news = 0, False
        self._leader_checked_at = self._started_at = self._head_read_at = float("-inf")
        self._leases_wanted = threading.Event()
        self.outbox: queue.Queue[Contribution] = queue.Queue()
        self.inbox: queue.Queue[Arrival] = queue.Queue()
        self.wake = threading.Event()
        self.failure: BaseException | None = None
        self.leadership = Leadership(mailbox, node_id, lease_seconds, clock.now)
        self.leases = Leases(mailbox, node_id, lease_seconds, clock.now, emit)
        self.merger = Merger(mailbox, run, method, node_id, emit, clock.now, self.leases, compression)
        # fragment -> (round, payload sha) of this node's contribution awaiting its commit: the sha tells this
        # contribution from one of an earlier life of the node under the same id.
        self.sent: dict[int, tuple[int, str]] = {}
        self.own_norms = OwnNorms(method.rounds(len(run.plan)).max_norm_ratio)  # refuses a Δ far beyond them
        self._unsent: Contribution | None = None  # an upload that failed, tried again on the next turn
        self.head = [version for version, _ in (latest[q] for q in range(len(run.plan)))]  # moved in place
        self.feed = CommitFeed(mailbox, run, node_id, emit, latest, self.head, self._deliver, clock.now)
        self._stopping = threading.Event()
        # Leaving (closing()); a leader's turn failed (stop()); the training thread waits in gather().
        self._closing = self._head_unsure = self._gathering = False
        self._thread = threading.Thread(target=self._loop, name=f"slowlink-{node_id}", daemon=True)

    @property
    def fragments(self) -> int:
        return len(self.run.plan)

    def start(self) -> None:
        self._started_at = self._head_read_at = self.clock.now()  # joining read head.json a moment ago
        with ThreadPoolExecutor(1, thread_name_prefix=f"slowlink-{self.node_id}-start") as pool:
            observed = pool.submit(self.leases.observe, sweep=self.leadership.is_leader)  # beside the beat
            self._beat_lease()
            observed.result()
        self._thread.start()

    def request_leases(self) -> None:
        """Read the leases on the next turn (session.batch_size waits for that after joining)."""
        self._leases_wanted.set()
        self.wake.set()

    def closing(self) -> None:
        """The node leaves and waits for the commits of its contributions in flight: look for them every
        CLOSING_SECONDS, and once one is overdue, for a merger gone every 0.5 s."""
        self._closing = True
        self.merger.housekeeping.leaving = self.merger.looks.closing = True  # tidy on leaving; look often
        self.watch_seconds, self.overdue_slack = min(self.watch_seconds, 5 * CLOSING_SECONDS), 0.0
        self.wake.set()

    def stop(self) -> None:
        """Stop the thread, then leave: finish an unnamed commit, write the contributions a merger kept,
        release the leadership, drop the lease. A second Ctrl-C while waiting for the thread stops the wait,
        not the leaving: each part still runs, and the interrupt is raised once they have."""
        self._stopping.set()
        self.wake.set()
        interrupted: KeyboardInterrupt | None = None
        try:
            self._thread.join()
        except KeyboardInterrupt as error:
            interrupted = error
        # First a commit head.json does not name yet, head.json, the contributions a merger kept (own.py).
        first = [lambda: self.merger.own.hand_over(self.head)]
        at_once = [self.leadership.release, lambda: self.mailbox.delete([keys.node(self.node_id)])]
        if self.leadership.is_leader and interrupted is None:
            recover = [self._recover_head] if self._head_unsure else []  # a failed turn may leave one
            first[:0] = [*recover, lambda: self.merger.leave(list(self.head))]
            at_once.append(lambda: self.merger.housekeeping.tidy(list(self.head)))
        raised = leave(self.node_id, first, at_once, self.emit)  # every part runs, interrupted or not
        interrupted = interrupted or raised
        if interrupted is not None:
            raise interrupted

    # ---- the channel, as the driver sees it (engine/channel.py) --------------------------------------

    def publish(self, contribution: Contribution) -> None:
        self.outbox.put(contribution)
        self.wake.set()

    def arrivals(self) -> list[Arrival]:
        if not self.inbox.queue:  # most steps: nothing came (a read of the deque, without the queue's lock)
            return []
        found = []
        while not self.inbox.empty():  # only this thread takes from it
            found.append(self.inbox.get_nowait())
        return found

    def gather(self, deadline: float) -> Arrival | None:
        self._gathering = True
        self.wake.set()
        try:
            return self.inbox.get(timeout=max(0.0, deadline - self.clock.now()))
        except queue.Empty:
            return None
        finally:
            self._gathering = False

    def anchors(self) -> dict[int, tuple[int, dict]]:
        """The commits this node holds, brought to the model's device: the node's anchors to start from."""
        return {q: (version, self.on_device(params)) for q, (version, params) in self.latest.items()}

    def newest(self) -> list[int]:
        return list(self.head)

    def live_nodes(self, fresh: bool = False) -> set[str]:
        """fresh=True: from leases read within the last watch_seconds, and not in the first watch_seconds
        after this node started, when the nodes started with it may not have written theirs yet (reading
        them now otherwise). A node that joins later has no contribution to wait for before its first H steps."""
        if fresh and (
            self.clock.now() - self.leases.observed_at >= self.watch_seconds
            or self.leases.observed_at - self._started_at < self.watch_seconds
        ):
            self.leases.observe(sweep=self.leadership.is_leader)
        return self.leases.live()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.turn()
                self._quiet_turns = 0 if self._news else self._quiet_turns + 1
            except (MailboxError, PayloadError) as error:
                self._head_unsure |= self.leadership.is_leader  # a commit may be written that self.head lacks
                self.emit(Event("mailbox_error", self.node_id, str(error), {"error": type(error).__name__}))
            except BaseException as error:  # a bug: hand it to the training thread, which raises it
                self._head_unsure |= self.leadership.is_leader
                self.failure = error
                return
            self.clock.wait(self.wake, self._pause())
            self.wake.clear()

    def _pause(self) -> float:
        """Seconds to the next turn: poll_seconds after news (a commit, a contribution, a merge), then
        BACKOFF times longer each quiet turn, up to a quarter of this node's time between two of its syncs
        (within poll_seconds and look_seconds): a node that waits long looks less and less often."""
        between_syncs = self.status().step_seconds * self._syncs_every
        longest = min(self.look_seconds, max(self.poll_seconds, between_syncs / 4))
        pause = min(longest, self.poll_seconds * BACKOFF ** min(self._quiet_turns, 64))
        if self._closing:
            pause = min(pause, CLOSING_SECONDS)
        if self.leadership.is_leader:  # a merger turns when a round it waits for can close (looks.py)
            pause = min(pause, max(0.005, self.merger.next_look_at - self.clock.now()))
        elif self._gathering:  # the training thread waits for a commit: look when it may be in (follow.py)
            pause = min(pause, max(0.005, self.feed.next_look_at(self.sent) - self.clock.now()))
        return pause

    def turn(self) -> None:
        """One pass of the communication loop (also called directly by tests)."""
        self._news = False
        awaiting = set(self.sent)  # before this turn's uploads: a contribution just sent has no commit yet
        self.merger.own.tend(self.head, leading=self.leadership.is_leader)  # a merger's own contributions
        self._send_contributions()
        now = self.clock.now()
        # head.json and every fragment's next commit each look_seconds while nothing of this node awaits a commit
        # (nothing else tells it of new ones), else a quarter lease apart (the merger: to notice another
        # merger's commits); between, a follower probes the next commit of each fragment a contribution awaits.
        hint_seconds = self.observe_seconds if self.sent or self.leadership.is_leader else self.look_seconds
        if now - self._head_read_at >= hint_seconds:
            self._head_read_at = now
            self.feed.poll_head(None if self.leadership.is_leader else self.sent)
        elif not self.leadership.is_leader:
            for fragment in sorted(awaiting & set(self.sent)):
                if self._closing or self.feed.due(fragment):
                    self.feed.catch_up(fragment, awaited=self.sent)
        if now - self.leases.beaten_at >= self.beat_seconds:
            self._beat_lease()
        if self._leases_wanted.is_set() or now - self.leases.observed_at >= self.observe_seconds:
            self._leases_wanted.clear()  # (the merger also reads them when a round could close: live_nodes)
            self.leases.observe(sweep=self.leadership.is_leader)
        # A follower reads leader.json a quarter lease apart, or every watch_seconds while a commit it awaits
        # is overdue: a merger that left or died is replaced soon when someone needs it, cheaply when nobody does.
        overdue = self.feed.overdue(self.sent, self.overdue_slack)
        watch = self.watch_seconds if overdue else self.observe_seconds
        if not self.leadership.is_leader and now - self._leader_checked_at < watch:
            return
        self._leader_checked_at = now
        change = self.leadership.tick()
        if change == "elected":
            self.emit(
                Event("leader_elected", self.node_id, f"merging rounds from term {self.leadership.term}")
            )
            if self.leadership.term > 1:  # the run's first leader follows no merger that could leave one
                self._recover_head()
        elif change == "lost":
            self.emit(Event("leader_lost", self.node_id, "another node took over the leadership"))
        if self.leadership.is_leader:
            self._merge()

    def _send_contributions(self) -> None:
        while True:
            item, self._unsent = self._unsent, None
            if item is None:
                try:
                    item = self.outbox.get_nowait()
                except queue.Empty:
                    return
            if item.base < self.latest[item.fragment][0]:
                continue  # its round is already committed; the training thread carries these steps over
            try:
                self._upload(item)
            except MailboxError as error:
                self._unsent = (
                    item  # the same bytes under the same keys next turn: a retry cannot count twice
                )
                self.emit(Event("upload_failed", self.node_id, f"fragment {item.fragment} round {item.base + 1}: "
                                f"{error}; sent again next turn", {"fragment": item.fragment,
                                "round": item.base + 1, "error": type(error).__name__}))  # fmt: skip
                return  # the rest of the turn (news, lease, merging) does not wait for it

    def _upload(self, item: Contribution) -> None:
        round_ = item.base + 1
        if item.prepared is None:
            item.prepared = self._prepare(item, round_)
            if item.prepared is None:
                return  # refused: never published
        data, record = item.prepared
        # Awaited from before the PUT: if it lands with its answer lost, the commit naming it is ours.
        self.sent[item.fragment] = (round_, record["blob"])
        self.feed.sent(item.fragment)
        self._news = True
        self.own_norms.sent(item.fragment, record["norm"], item.steps)
        if self.leadership.is_leader:  # it merges this round itself: kept here, written only if it hands over
            self.merger.remember_own(record, data)
        else:
            self.mailbox.put(keys.contribution(item.fragment, round_, self.node_id), data)
        self.emit(Event("contribution_sent", self.node_id,
                        f"fragment {item.fragment} round {round_}: {item.steps} steps, {len(data)} bytes",
                        {"fragment": item.fragment, "round": round_, "step": item.step, "steps": item.steps,
                         "bytes": len(data), "blob": record["blob"]}))  # fmt: skip

    def _prepare(self, item: Contribution, round_: int) -> tuple[bytes, dict] | None:
        # Δ = θ_anchor − θ_local in the snapshot's own buffers, where they are (the model's device), here on
        # the communication thread: no second copy of the fragment. The snapshot is the node's record of the
        # contribution too: it holds Δ from now on.
        delta = item.snapshot
        for name, values in delta.items():
            subtract_into(item.anchor[name], values)
        # Its norm is reported, so that the merger can judge each contribution against the others.
        norm = l2_norm(self.run.judged(delta))
        return self.frame(item, round_, norm, lambda: self._encode(item.fragment, delta))

    def frame(
        self, item: Contribution, round_: int, norm: float, encode: Callable
    ) -> tuple[bytes, dict] | None:
        """(payload, record) of a contribution of Δ's `norm`, whose entries `encode()` gives with the new
        error-feedback residual (or None), as encode_fragment does; None where its norm is refused. An
        island's rank 0 calls it with a Δ it encoded tensor by tensor (collective/island.py)."""
        if (reason := self.own_norms.judge(item.fragment, norm, item.steps)) is not None:
            self.emit(Event("contribution_refused", self.node_id, f"fragment {item.fragment} round {round_}: "
                            f"{reason}; not published", {"fragment": item.fragment, "round": round_,
                            "steps": item.steps, "reason": reason}))  # fmt: skip
            self.inbox.put(Refused(item.fragment, round_, reason))  # the training thread raises it
            return None
        claims = {"base": item.base, "samples": item.samples, "steps": item.steps, "final": item.final,
                  "step_seconds": item.step_seconds, "norm": norm}  # fmt: skip
        header = contribution.header(self.run, item.fragment, round_, self.node_id, claims)
        try:
            encoded, residual = encode()
        except PayloadError as error:  # raised in the training thread by the next session.step()
            raise TrainingDiverged(
                f"fragment {item.fragment}'s contribution after local step {item.step} cannot be sent: {error}"
            ) from None
        if residual is not None:  # with error feedback: what this encoding lost, for the next one
            self.residual_in_flight[item.fragment] = residual
        data = payload.pack_encoded(encoded, header, encoding=self.encoding)
        data = compress(data) if self.compression == "zstd" else data
        where = {"node": self.node_id, "fragment": item.fragment, "round": round_}
        return data, claims | where | {"blob": payload.digest(data)}

    def _encode(self, fragment: int, delta: Arrays) -> tuple[dict, Arrays | None]:
        # On the model's device where the encoding allows it: then only the encoded bytes come to host.
        return encode_fragment(delta, self.encoding, feedback=self.wire.error_feedback,
                               residual=self.residual.get(fragment), buffer=self.buffer)  # fmt: skip

    def _deliver(self, fragment: int, version: int, params: Arrays, record: dict) -> None:
        # The fate first: it may read the store, and if that fails nothing has changed, so the next turn
        # delivers this commit again instead of losing what became of this node's contribution.
        mine, rejected = self._fate_of_mine(fragment, version, record)
        self._news = True  # queued first: whoever sees `latest` move finds the arrival waiting
        self.inbox.put(Arrival(fragment, version, self.on_device(params), mine, rejected))
        self.latest[fragment] = (version, params)

    def _fate_of_mine(self, fragment: int, version: int, record: dict) -> tuple[str | None, str | None]:
        """(What became of this node's contribution awaiting it, the merger's reason if it was rejected.)"""
        awaited = self.sent.get(fragment)
        if awaited is None or awaited[0] > version:
            return None, None
        round_, sha = awaited
        if round_ != version:
            record = read_commit(self.mailbox, fragment, round_) or {"contributors": [], "rejected": []}
        del self.sent[fragment]
        merged = any(c.get("node") == self.node_id and c.get("blob") == sha for c in record["contributors"])
        residual = self.residual_in_flight.pop(fragment, None)
        if merged and residual is not None:
            self.residual[fragment] = residual  # what this contribution's encoding lost goes into the next
        self.own_norms.settled(fragment, merged)
        if merged:
            return "merged", None
        reasons = [r["reason"] for r in record["rejected"] if r.get("node") == self.node_id]
        return ("rejected", reasons[0]) if reasons else ("missed", None)

    def _beat_lease(self) -> None:
        status = self.status()
        self.leases.beat({"step": status.step, "samples": status.samples, "step_seconds": status.step_seconds,
                          "versions": [self.latest[q][0] for q in range(self.fragments)],
                          "leader": self.leadership.is_leader})  # fmt: skip

    def _recover_head(self) -> None:
        """A new leader finishes what a crashed one left: commits written but not yet in head.json."""
        for fragment in range(self.fragments):
            round_ = probe_newest(self.mailbox, fragment, self.head[fragment])
            if round_ > self.head[fragment]:
                self.merger.head_written = advance_head(self.mailbox, list(self.head), fragment, round_)
                self.feed.fetch(fragment, round_)
        self._head_unsure = False

    def _merge(self) -> None:
        # Only fragments whose newest commit this node holds: it builds on nothing older.
        ready = {q: self.latest[q] for q in range(self.fragments) if self.latest[q][0] == self.head[q]}
        between_syncs = self.status().step_seconds * self._syncs_every  # others' contributions come as often
        self.merger.looks.poll_seconds = self.poll_seconds
        # Before this node's first step it knows no sync period: nodes ahead of it are looked for every
        # watch_seconds, not every poll (a node waiting for the others to start would list rounds/ on end).
        idle = between_syncs if between_syncs > 0 else self.watch_seconds
        self.merger.looks.look_seconds = min(self.watch_seconds, max(self.poll_seconds, idle))
        for committed in self.merger.step(ready, self.live_nodes, self.head):
            self.head[committed.fragment] = committed.round
            self._deliver(committed.fragment, committed.round, committed.params, committed.record)
