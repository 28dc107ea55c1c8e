"""Session and align: the user's door to a run.

`session.step()` runs on the training thread and only does bookkeeping: counting steps, applying the
commits the communication thread has fetched (in place, between two of the user's steps), and, when a
fragment is due, snapshotting it to host memory. Every request to the mailbox happens on the
communication thread (protocol/courier.py). The only waits are the ones `overlap_steps` asks for.
"""

import math
import os
import queue
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .algorithms.diloco import DiLoCo
from .algorithms.mixing import carry_change, carry_overlap_change
from .algorithms.schedule import due_fragments
from .errors import ConfigError, RunConfigMismatch, SessionStateError
from .events import Event, JsonLines, log_event
from .frameworks.base import adapter_for, compare_schemas, schema_digest
from .mailbox.contract import Mailbox
from .mailbox.metered import Metered
from .protocol import keys
from .protocol.courier import Alignment, Contribution, Courier, NodeStatus
from .protocol.leader import refuse_if_live
from .protocol.run import load_newest, open_run, read_run
from .protocol.trust import ENVIRONMENT_VARIABLE, RunKey, Signed
from .wire.encodings import ENCODINGS


@dataclass(frozen=True)
class SessionStats:
    """A snapshot of what this node has done; counters of work that did not reach the model included."""

    node: str
    step: int
    samples: int
    versions: tuple[int, ...]  # the commit each fragment is aligned with
    commits_applied: int  # commits this node applied
    rounds_merged: int  # rounds this node closed as the leader
    contributions_sent: int
    contributions_late: int  # missed their round; their steps were carried into the next contribution
    contributions_rejected: int  # rejected by this node as the leader, with reasons in the commit records
    syncs_deferred: int  # due while the in-flight limit was reached; published later, nothing lost
    syncs_skipped: int  # due for a round already committed (a node joining mid-round); steps carried
    steps_replaced: int  # overlap steps replaced by a commit (mixing keeps a share of them)
    steps_dropped: int  # steps trained but never merged: dropped when the node left
    steps_unconfirmed: int  # published, but not committed before the node left: the run may still merge them
    bytes_sent: int
    bytes_received: int
    requests: int
    is_leader: bool


@dataclass
class _InFlight:
    round: int
    snapshot_step: int
    steps: int
    samples: int
    # The snapshot, which the communication thread turns into Δ = anchor − snapshot in place before it
    # uploads; once a commit holding this contribution arrives, Δ is there to carry the overlap steps.
    delta: dict
    uploaded: bool = False  # the contribution went out: `delta` holds Δ, and nothing writes it any more
    blob: str | None = None  # the sha256 of its payload, once uploaded, when the courier tells it
    fate: str | None = None  # "merged" or "missed" when a resumed node read it from the commit itself


class Session:
    """Joins a run on `with`, trains in it through `step()`, and leaves it on exit.

    model: a torch.nn.Module. algorithm: e.g. sl.DiLoCo(sync_every=100). mailbox: where the run lives.
    node_id: this node's name in the run ([a-z0-9_-], default host-pid). compression: None or "zstd".
    on_event: called with every Event (also logged on the "slowlink" logger). events_file: a path that
    every Event is appended to as a JSON line (docs/events.md).
    poll_seconds: how often the communication thread looks for news. lease_seconds: how long a silent
    node (or leader) is still trusted. close_timeout: how long leaving waits for rounds in flight.
    run_key: a secret shared by the run's nodes (default: SLOWLINK_RUN_KEY, else none); every record is
    then signed and checked, and contributions not signed with it are rejected (docs/robustness.md).
    """

    def __init__(
        self,
        model: object,
        *,
        algorithm: DiLoCo,
        mailbox: Mailbox,
        node_id: str | None = None,
        compression: str | None = None,
        on_event: Callable[[Event], None] | None = None,
        poll_seconds: float = 0.25,
        lease_seconds: float = 120.0,
        close_timeout: float = 60.0,
        run_key: str | bytes | None = None,
        events_file: str | os.PathLike | None = None,
    ) -> None:
        if not isinstance(algorithm, DiLoCo):
            raise ConfigError(
                f"algorithm={algorithm!r} must be a slowlink method such as sl.DiLoCo(sync_every=100)"
            )
        self.node_id = node_id if node_id is not None else _default_node_id()
        if not keys.NODE_ID.match(self.node_id):
            raise ConfigError(
                f"node_id={self.node_id!r} must be 1-64 of [a-z0-9_-], starting with a letter or digit"
            )
        if compression not in (None, "zstd"):
            raise ConfigError(f"compression={compression!r} must be None or 'zstd'")
        for name, value in (("poll_seconds", poll_seconds), ("lease_seconds", lease_seconds),
                            ("close_timeout", close_timeout)):  # fmt: skip
            if not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{name}={value!r} must be a positive number of seconds")
        encoding = algorithm.delta_dtype or "F32"
        for name in ("delta_dtype", "commit_dtype"):
            if (getattr(algorithm, name) or "F32") not in ENCODINGS:
                raise ConfigError(f"{name}={getattr(algorithm, name)!r} is not available in this build")
        self.model, self.algorithm, self.compression = model, algorithm, compression
        self.run_key = RunKey.resolve(run_key)
        # Entries a store lists that slowlink could not have written are skipped; this node reports them.
        mailbox.on_ignored = self._key_ignored
        self.mailbox = _trusted(Metered(mailbox), self.run_key)
        self.poll_seconds, self.lease_seconds, self.close_timeout = poll_seconds, lease_seconds, close_timeout
        self._on_event = on_event
        self._events_file = JsonLines(events_file) if events_file is not None else None
        self._last_commit_at: float | None = None  # for metrics(): when a commit was last applied
        self._busy_in_step = 0.0  # seconds spent inside step(), waits for rounds included
        self._encoding = encoding
        self._counts: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        self._state = "new"

    # ---- joining and leaving -------------------------------------------------------------------------

    def __enter__(self) -> "Session":
        if self._state != "new":
            raise SessionStateError("a Session can be entered once; create a new Session to train again")
        self.adapter = adapter_for(self.model)
        digest = schema_digest(self.adapter.schema)
        self.run, created = open_run(
            self.mailbox,
            config=self.algorithm.to_dict(),
            schema=self.adapter.schema,
            schema_digest=digest,
            plan=self.algorithm.plan(self.adapter.schema),
            initial=lambda: [
                self.adapter.snapshot(group) for group in self.algorithm.plan(self.adapter.schema)
            ],
            key_id=self.run_key.key_id if self.run_key else None,
        )
        self.plan = self.run.plan
        refuse_if_live(self.mailbox, self.node_id, self.lease_seconds)
        latest = load_newest(self.mailbox, self.run)
        for _, params in latest.values():
            self.adapter.assign(params)  # a joiner starts from the committed model
        self._anchors = dict(latest)
        fragments = len(self.plan)
        self._offsets = self.algorithm.offsets(fragments)
        self._step = self._samples = 0
        # A joiner takes the run's phase: the step at which the newest commit was due (fragment q's k-th sync
        # is at step offset_q + k·H). Its fragments then fall due when everyone else's do, so a round that
        # waits for every node, or a barrier, closes. A new run starts at step 0.
        versions = [latest[q][0] for q in range(fragments)]
        self._phase = max(
            [offset + version * self.algorithm.sync_every for offset, version in zip(self._offsets, versions, strict=True) if version],
            default=0,
        )  # fmt: skip
        self._pending_steps = [0] * fragments
        self._pending_samples = [0] * fragments
        self._in_flight: dict[int, _InFlight] = {}
        self._owed: set[int] = set()
        self._step_seconds = 0.0
        self._last_step_at: float | None = None
        self.courier = Courier(
            self.mailbox, self.run, self.algorithm, self.node_id, dict(latest),
            emit=self._emit, status=self._status, poll_seconds=self.poll_seconds,
            lease_seconds=self.lease_seconds, encoding=self._encoding, compression=self.compression,
        )  # fmt: skip
        self.courier.start()
        self._state = "open"
        self._entered_at = time.perf_counter()
        versions = [version for version, _ in latest.values()]
        self._emit(Event("run_created" if created else "joined", self.node_id,
                         f"{'created' if created else 'joined'} run {self.run.run_id[:8]} at versions {versions}",
                         {"versions": versions}))  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        if self._state != "open":
            return
        self._state = "closing"
        try:
            if exc[0] is None:
                self._finish_rounds()
        finally:
            self.courier.stop()
            self._state = "closed"
        self._emit(Event("left", self.node_id, f"left after {self._step} steps", {"steps": self._step}))

    def _finish_rounds(self) -> None:
        """Wait for rounds in flight (publishing every pending step first if flush_on_close), then align
        every fragment with its newest commit."""
        flush = self.algorithm.flush_on_close
        deadline = time.monotonic() + self.close_timeout
        while time.monotonic() < deadline:
            if flush:  # steps carried over by a commit that arrived meanwhile are published on the next pass
                for fragment in range(len(self.plan)):
                    if fragment not in self._in_flight and self._pending_steps[fragment] > 0:
                        self._publish(fragment, final=True)
            if not self._in_flight:
                break
            self._wait_for_alignment(timeout=min(0.5, max(0.01, deadline - time.monotonic())))
        self._drain_alignments()
        dropped = sum(self._pending_steps)
        if dropped:
            why = (
                "were never published"
                if flush
                else "were not merged (set flush_on_close=True to publish them)"
            )
            self._emit(Event("steps_dropped", self.node_id,
                             f"{dropped} fragment-steps trained since the last sync {why}", {"steps": dropped}))  # fmt: skip
        unconfirmed = sum(flight.steps for flight in self._in_flight.values())
        if unconfirmed:  # published: a later commit may still merge them, and its record will say so
            rounds = sorted((fragment, flight.round) for fragment, flight in self._in_flight.items())
            self._emit(Event("steps_unconfirmed", self.node_id,
                             f"{unconfirmed} fragment-steps in contributions to (fragment, round) {rounds} were "
                             f"not committed within close_timeout={self.close_timeout}s; the run may still merge "
                             "them", {"steps": unconfirmed, "rounds": rounds}))  # fmt: skip
        self.adapter.assign(
            {name: values for _, params in self._anchors.values() for name, values in params.items()}
        )

    # ---- the training thread's part ------------------------------------------------------------------

    def step(self, samples: int = 1) -> None:
        """Call after each optimizer step; `samples` is what that step trained on (sequences or tokens)."""
        if self._state != "open":
            raise SessionStateError(
                "session.step() was called outside the Session's `with` block; call it inside "
                "`with sl.Session(...) as session:`"
            )
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise ConfigError(f"session.step(samples={samples!r}): samples must be a non-negative integer")
        if self.courier.failure is not None:
            raise self.courier.failure
        now = time.perf_counter()
        if self._last_step_at is not None:
            elapsed = now - self._last_step_at
            self._step_seconds = (
                elapsed if self._step_seconds == 0 else 0.9 * self._step_seconds + 0.1 * elapsed
            )
        self._last_step_at = now
        self._step += 1
        self._samples += samples
        for fragment in range(len(self.plan)):
            self._pending_steps[fragment] += 1
            self._pending_samples[fragment] += samples
        self._drain_alignments()
        due = self._due_now()
        self._owed.update(due)
        for fragment in sorted(self._owed):
            if fragment in self._in_flight or len(self._in_flight) >= self.algorithm.max_in_flight:
                continue
            self._owed.discard(fragment)
            if self._pending_steps[fragment] > 0:  # a commit may have replaced every step since the last sync
                self._publish(fragment, final=False)
        self._count_deferred(due)
        self._wait_for_overlap()
        self._busy_in_step += time.perf_counter() - now

    def _due_now(self) -> list[int]:
        """The fragments due at this step. Where nodes wait for rounds (overlap_steps set), a sync whose
        round, by the schedule, is already committed is skipped and its steps go into the next one: a node
        that joined mid-round would otherwise be a round ahead of the others, each waiting on the other."""
        step = self._phase + self._step
        due = due_fragments(step, self.algorithm.sync_every, self._offsets)
        if self.algorithm.overlap_steps is None:
            return due  # decoupled: contribute to the next open round, whichever it is
        fresh = []
        for fragment in due:
            round_ = (step - self._offsets[fragment]) // self.algorithm.sync_every
            if self._anchors[fragment][0] >= round_:
                self._emit(Event("sync_skipped", self.node_id,
                                 f"fragment {fragment} round {round_} is already committed; its steps go into "
                                 "the next sync", {"fragment": fragment, "round": round_}))  # fmt: skip
            else:
                fresh.append(fragment)
        return fresh

    def _count_deferred(self, due: list[int]) -> None:
        for fragment in due:
            if fragment in self._owed:
                self._emit(Event("sync_deferred", self.node_id,
                                 f"fragment {fragment} is due but its previous contribution is still in flight; "
                                 "it will be published as soon as that commits", {"fragment": fragment}))  # fmt: skip

    def _publish(self, fragment: int, *, final: bool) -> None:
        version, anchor = self._anchors[fragment]
        snapshot = self.adapter.snapshot(self.plan[fragment])
        flight = _InFlight(
            version + 1, self._step, self._pending_steps[fragment], self._pending_samples[fragment], snapshot
        )
        self._in_flight[fragment] = flight
        self._pending_steps[fragment] = self._pending_samples[fragment] = 0
        contribution = Contribution(
            fragment=fragment, step=self._step, base=version, anchor=anchor, snapshot=snapshot, steps=flight.steps,
            samples=flight.samples, final=final, step_seconds=self._step_seconds,
        )  # fmt: skip
        self.courier.outbox.put(contribution)
        self.courier.wake.set()

    def _wait_for_overlap(self) -> None:
        tau = self.algorithm.overlap_steps
        if tau is None:
            return
        while any(self._step - flight.snapshot_step >= tau for flight in self._in_flight.values()):
            self._wait_for_alignment(timeout=0.5)

    def _wait_for_alignment(self, timeout: float) -> None:
        try:
            self._apply(self.courier.inbox.get(timeout=timeout))
        except queue.Empty:
            if self.courier.failure is not None:
                raise self.courier.failure from None

    def _drain_alignments(self) -> None:
        while True:
            try:
                self._apply(self.courier.inbox.get_nowait())
            except queue.Empty:
                return

    def _apply(self, alignment: Alignment) -> None:
        """Align one fragment with a newer commit, in place (research/algorithms.md §2.3)."""
        fragment = alignment.fragment
        version, anchor = self._anchors[fragment]
        if alignment.version <= version:
            return
        flight = self._in_flight.get(fragment)
        if flight is not None and flight.round > alignment.version:
            flight = None  # still waiting for a later round
        mine = (flight.fate or alignment.mine) if flight is not None else alignment.mine
        mixing = self.algorithm.mixing
        if flight is not None and mine == "merged" and mixing is None:
            # θ ← θ + (Θ_new − θ_snapshot), θ_snapshot = anchor − Δ: the steps trained while the round was in
            # flight stay, on top of the commit, and go into the next contribution. Nothing is lost.
            self.adapter.shift(carry_overlap_change(anchor, alignment.params, flight.delta))
        elif flight is not None and mine == "merged":
            # θ ← α·θ + (1−α)·Θ (Streaming DiLoCo): the steps since the snapshot are partly replaced.
            self.adapter.blend(alignment.params, mixing)
            overlap = self._pending_steps[fragment]
            if overlap:
                self._emit(Event("steps_replaced", self.node_id,
                                 f"fragment {fragment}: {overlap} steps trained while round {flight.round} was in "
                                 f"flight were blended with mixing={mixing}", {"steps": overlap}))  # fmt: skip
            if mixing == 0:
                self._pending_steps[fragment] = self._pending_samples[fragment] = 0
        else:
            # θ ← θ + (Θ_new − Θ_old): keep every local step; the next contribution carries them.
            self.adapter.shift(carry_change(anchor, alignment.params))
            if flight is not None:
                self._pending_steps[fragment] += flight.steps
                self._pending_samples[fragment] += flight.samples
                self._emit(Event("contribution_late", self.node_id,
                                 f"fragment {fragment} round {flight.round} was committed without this node's "
                                 f"contribution; its {flight.steps} steps go into the next one",
                                 {"fragment": fragment, "round": flight.round, "steps": flight.steps}))  # fmt: skip
        if flight is not None:
            del self._in_flight[fragment]
        self._anchors[fragment] = (alignment.version, alignment.params)
        self._emit(Event("commit_applied", self.node_id, f"fragment {fragment} now at round {alignment.version}",
                         {"fragment": fragment, "round": alignment.version}))  # fmt: skip

    # ---- what the communication thread and the user read ---------------------------------------------

    def _status(self) -> NodeStatus:
        return NodeStatus(self._step, self._samples, self._step_seconds)

    def _key_ignored(self, key: str, reason: str) -> None:
        self._emit(Event("key_ignored", self.node_id, f"the mailbox ignores {key!r}: {reason}",
                         {"key": key, "reason": reason}))  # fmt: skip

    def _emit(self, event: Event) -> None:
        if event.kind == "contribution_sent":  # on the communication thread, once the upload landed
            flight = self._in_flight.get(event.data["fragment"])
            if flight is not None and flight.round == event.data["round"]:
                flight.uploaded, flight.blob = True, event.data.get("blob")
        with self._count_lock:
            self._counts[event.kind] += 1
            if event.kind in ("steps_replaced", "steps_dropped", "steps_unconfirmed"):
                self._counts[event.kind + ":steps"] += event.data.get("steps", 0)
            if event.kind == "commit_applied":
                self._last_commit_at = time.monotonic()
        log_event(event)
        if self._events_file is not None:
            self._events_file(event)
        if self._on_event is not None:
            self._on_event(event)

    @property
    def stats(self) -> SessionStats:
        counts = self._counts
        return SessionStats(
            node=self.node_id,
            step=self._step,
            samples=self._samples,
            versions=tuple(version for version, _ in (self._anchors[q] for q in range(len(self.plan)))),
            commits_applied=counts["commit_applied"],
            rounds_merged=counts["round_merged"],
            contributions_sent=counts["contribution_sent"],
            contributions_late=counts["contribution_late"],
            contributions_rejected=counts["contribution_rejected"],
            syncs_deferred=counts["sync_deferred"],
            syncs_skipped=counts["sync_skipped"],
            steps_replaced=counts["steps_replaced:steps"],
            steps_dropped=counts["steps_dropped:steps"],
            steps_unconfirmed=counts["steps_unconfirmed:steps"],
            bytes_sent=self.mailbox.bytes_sent,
            bytes_received=self.mailbox.bytes_received,
            requests=self.mailbox.total_requests,
            is_leader=self.courier.leadership.is_leader,
        )

    def metrics(self) -> dict[str, float | None]:
        """Figures for a dashboard, all numbers (the TensorBoard adapter in slowlink.ops logs them as they
        are): bytes and requests, rounds, seconds since the last commit applied (None before the first),
        staleness (commits known to this node but not yet applied; this node's steps not yet in any
        commit), and utilization (the share of wall time since joining spent outside session.step(),
        i.e. training rather than waiting for rounds or snapshotting)."""
        if self._state == "new":
            raise SessionStateError("session.metrics() is available once the Session is entered (`with`)")
        stats = self.stats
        wall = time.perf_counter() - self._entered_at
        versions = [version for version, _ in (self._anchors[q] for q in range(len(self.plan)))]
        unmerged = [
            self._pending_steps[q] + (self._in_flight[q].steps if q in self._in_flight else 0)
            for q in range(len(self.plan))
        ]
        return {
            "step": stats.step,
            "samples": stats.samples,
            "bytes_sent": stats.bytes_sent,
            "bytes_received": stats.bytes_received,
            "requests": stats.requests,
            "commits_applied": stats.commits_applied,
            "rounds_merged": stats.rounds_merged,
            "contributions_sent": stats.contributions_sent,
            "contributions_late": stats.contributions_late,
            "contributions_rejected": stats.contributions_rejected,
            "seconds_since_commit": (
                None if self._last_commit_at is None else time.monotonic() - self._last_commit_at
            ),
            "staleness_rounds": max(
                (h - v for h, v in zip(self.courier.head, versions, strict=True)), default=0
            ),
            "staleness_steps": max(unmerged, default=0),
            "utilization": 1.0 - self._busy_in_step / wall if wall > 0 else 1.0,
            "step_seconds": self._step_seconds,
            "is_leader": int(stats.is_leader),
        }

    @property
    def batch_size(self) -> int:
        """This node's share of global_batch_size: divided by the live nodes, rounded up."""
        if self.algorithm.global_batch_size is None:
            raise ConfigError(
                "session.batch_size needs DiLoCo(global_batch_size=...): the batch all nodes share"
            )
        return math.ceil(self.algorithm.global_batch_size / len(self.courier.live_nodes()))


def _default_node_id() -> str:
    host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-")[:40] or "node"
    return f"{host}-{os.getpid()}"


def _trusted(mailbox: Mailbox, run_key: RunKey | None) -> Mailbox:
    """With a run key, the mailbox as the protocol sees it: every record signed on write, checked on read."""
    return mailbox if run_key is None else Signed(mailbox, run_key)


def align(model: object, *, mailbox: Mailbox, run_key: str | bytes | None = None) -> dict[int, int]:
    """Load the newest committed model into `model` without joining the run; returns fragment -> version.
    run_key: the run's key if it is signed (default: SLOWLINK_RUN_KEY); every record read is checked."""
    adapter = adapter_for(model)
    key = RunKey.resolve(run_key)
    mailbox = _trusted(mailbox, key)
    run = read_run(mailbox)
    if run is None:
        raise ConfigError(f"{mailbox!r} holds no run (no {keys.RUN}); check the mailbox path or prefix")
    if run.key_id is not None and key is None:
        raise RunConfigMismatch(
            f"this run is signed with run key {run.key_id}: pass run_key= (or set {ENVIRONMENT_VARIABLE})"
        )
    compare_schemas(adapter.schema, run.schema)
    newest = load_newest(mailbox, run)
    for _, params in newest.values():
        adapter.assign(params)
    return {q: version for q, (version, _) in newest.items()}
