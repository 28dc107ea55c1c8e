"""Session and align: the user's door to a run.

A Session joins the run a mailbox holds, and drives this node through the engine: the method's round-keeping
(engine/node.py, on the training thread) over the mailbox channel (protocol/courier.py, the communication
thread). `session.step()` only does bookkeeping: counting the step, applying the commits the communication
thread has fetched (in place, between two of the user's steps), and, when a fragment is due, snapshotting it
to host memory. The only waits are the ones `overlap_steps` asks for.
"""

import math
import os
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .algorithms.gossip import GossipMethod
from .algorithms.method import Method
from .clock import REAL
from .engine.node import Node
from .engine.samples import count_of
from .engine.stall import StallWatch
from .engine.stats import SessionStats
from .errors import ConfigError, MailboxUnavailable, SessionStateError
from .events import Event, JsonLines, log_event
from .frameworks.base import adapter_for, compare_frozen, frozen_of, on_device_of, schema_digest
from .mailbox.contract import Mailbox
from .mailbox.memory import MemoryMailbox
from .mailbox.metered import Metered
from .mailbox.named import open_mailbox
from .protocol.chain import load_newest
from .protocol.courier import Courier, NodeStatus
from .protocol.gossip import GossipSession
from .protocol.joined import joined_event, refuse_resuming
from .protocol.leases import refuse_if_live
from .protocol.run import open_run
from .protocol.session_checks import check_options, default_node_id
from .protocol.trust import RunKey, trusted_view


class Session:
    """Joins a run on `with`, trains in it through `step()`, and leaves it on exit.

    model: a torch.nn.Module or an mlx.nn.Module. algorithm: a method, e.g. sl.DiLoCo(sync_every=100). mailbox:
    where the run lives (or sl.collective.AllReduce(group): the group's ranks are the run's nodes, no store;
    docs/islands.md). node_id: this node's name in the run ([a-z0-9_-], default host-pid). compression: None
    or "zstd".
    on_event: called with every Event (also logged on the "slowlink" logger). events_file: a path that
    every Event is appended to as a JSON line (docs/events.md).
    poll_seconds: how soon the communication thread looks for news after some (it waits longer while
    nothing comes, up to a quarter of the time between two syncs). lease_seconds: how long a silent
    node (or leader) is still trusted. close_timeout: how long leaving waits for rounds in flight.
    run_key: a secret shared by the run's nodes (default: SLOWLINK_RUN_KEY, else none); every record is
    then signed and checked, and contributions not signed with it are rejected (docs/robustness.md).
    params: what the run synchronizes, tensor names or a predicate name -> bool (default: the trainable
    parameters and the floating-point buffers; frameworks/torch.py says what happens to the rest).
    on_stall: "warn" (emit `stalled` and train on) or "raise" (session.step() raises MailboxUnavailable)
    when no commit has arrived for a while and the store keeps failing. resume: False refuses to join a run
    that has commits already (a script re-run on an old run's folder would otherwise continue it).
    island: a torch.distributed process group (e.g. torch.distributed.group.WORLD under torchrun) whose ranks
    are this one node: every rank runs the same lines, rank 0 alone talks to the mailbox (docs/islands.md).
    A mailbox may also be named: a folder path, or "s3://bucket/prefix" (mailbox/named.py).
    `start()` and `close()` do what `with` does, for loops that cannot sit in a `with` block.
    A gossip method (sl.GossipDiLoCo, sl.NoLoCo) makes a gossip node instead (protocol/gossip.py, docs/gossip.md).
    """

    def __new__(cls, model: object = None, *, algorithm: object = None, **options: object) -> "Session":
        if isinstance(algorithm, GossipMethod):  # no rounds to merge: a gossip node (protocol/gossip.py)
            return GossipSession(model, algorithm=algorithm, **options)
        return super().__new__(cls)

    def __init__(
        self,
        model: object,
        *,
        algorithm: Method,
        mailbox: Mailbox | str | os.PathLike,
        node_id: str | None = None,
        compression: str | None = None,
        on_event: Callable[[Event], None] | None = None,
        poll_seconds: float = 0.25,
        lease_seconds: float = 120.0,
        close_timeout: float = 60.0,
        run_key: str | bytes | None = None,
        events_file: str | os.PathLike | None = None,
        params: object = None,
        on_stall: str = "warn",
        resume: bool = True,
        island: object = None,
    ) -> None:
        check_options(algorithm, node_id, compression, poll_seconds, lease_seconds, close_timeout)
        if on_stall not in ("warn", "raise") or not isinstance(resume, bool):
            raise ConfigError(
                f"on_stall={on_stall!r} must be 'warn' or 'raise', resume={resume!r} True or False"
            )
        self.on_stall, self.resume = on_stall, resume
        self.island = None if island is None else _island_of(island)
        self.fabric = (
            mailbox if callable(getattr(mailbox, "enter", None)) else None
        )  # sl.collective.AllReduce
        mailbox = (
            open_mailbox(mailbox) if self.fabric is None else MemoryMailbox()
        )  # (then nothing is stored)
        self.node_id = node_id if node_id is not None else default_node_id()
        self.model, self.algorithm, self.compression, self.params = model, algorithm, compression, params
        self.run_key = RunKey.resolve(run_key)
        self.raw_mailbox = mailbox
        self.mailbox = trusted_view(Metered(mailbox), self.run_key)
        self.poll_seconds, self.lease_seconds, self.close_timeout = poll_seconds, lease_seconds, close_timeout
        self.clock = REAL
        self._on_event = on_event
        self._events_file = JsonLines(events_file) if events_file is not None else None
        self._last_commit_at: float | None = None  # for metrics(): when a commit was last applied
        self._counts: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        self.node: Node | None = None
        self._stall: StallWatch | None = None
        self._stall_error: MailboxUnavailable | None = None
        self._state = "new"

    # ---- joining and leaving -------------------------------------------------------------------------

    def __enter__(self) -> "Session":
        if self._state != "new":
            raise SessionStateError("a Session can be entered once; create a new Session to train again")
        # Entries a store lists that slowlink could not have written are skipped; this node reports them.
        self.raw_mailbox.on_ignored = self._key_ignored
        self.adapter = adapter_for(self.model, self.params)
        if self.island is not None:  # an FSDP2 model's ranks each train their shard (collective/shards.py)
            from .collective.shards import island_adapter

            self.adapter = island_adapter(self.island, self.adapter)
        clock = self.clock
        if self.island is None and self.fabric is None:
            created, versions = self._join_mailbox()
            channel, anchors = self.courier, self.courier.anchors()
        else:  # one node of many ranks (collective/island.py), or a run over a process group (allreduce.py)
            from .collective.island import IslandClock, enter_island

            start = (
                self.fabric.enter(self.adapter, self.algorithm, self.node_id, self._emit) if self.fabric is not None else
                enter_island(self.island, self.adapter, self.algorithm, self._join_mailbox, lambda: self.courier)
            )  # fmt: skip
            created, versions, self.plan, channel, anchors = start.created, start.versions, start.plan, start.channel, start.anchors  # fmt: skip
            self.courier, self.rounds = start.courier, self.algorithm.rounds(len(self.plan))
            clock = IslandClock(self.island) if self.island is not None else self.clock
        self.node = Node(
            node_id=self.node_id, rounds=self.rounds, adapter=self.adapter, plan=self.plan, channel=channel,
            clock=clock, latest=anchors, emit=self._emit,
        )  # fmt: skip
        self._entered_at = self.clock.now()
        self._stall = StallWatch(
            self.node_id, sync_every=self.rounds.sync_every, poll_seconds=self.poll_seconds,
            step_seconds=lambda: self.node.step_seconds, head=lambda: sum(self.courier.newest()),
            since=self._entered_at,
        )  # fmt: skip
        self.courier.start()
        self._leases_read_at_join = getattr(self.courier, "leases", None) and self.courier.leases.reads
        self._state = "open"
        if created is not None:  # (an island's other ranks have joined no mailbox)
            self._announce(created, versions)
        self._say_if_plan_reduced()
        return self

    def _join_mailbox(self) -> tuple[bool, list[int]]:
        """Open the run (or create it), take its newest commits, and make the Courier; (created, versions)."""
        plan = self.algorithm.plan(self.adapter.schema)
        self.run, created = open_run(
            self.mailbox, config=self.algorithm.to_dict(), schema=self.adapter.schema,
            schema_digest=schema_digest(self.adapter.schema), plan=plan,
            initial=lambda: [self.adapter.snapshot(group) for group in plan],
            key_id=self.run_key.key_id if self.run_key else None, frozen=frozen_of(self.adapter),
            statistics=getattr(self.adapter, "statistics", []), node_id=self.node_id, clock=self.clock.now,
            sleep=self.clock.sleep,
        )  # fmt: skip
        self.plan = self.run.plan
        if created:  # commit 0 is this node's model, just written: no commit follows it before others train,
            # and no process holds a lease in a run this one has just created, under this node's id or any
            latest = {q: (0, self.adapter.snapshot(group)) for q, group in enumerate(self.plan)}
        else:  # the watch for another live process under this id, beside the reads of the newest commits
            with ThreadPoolExecutor(1, thread_name_prefix=f"slowlink-{self.node_id}-join") as pool:
                refused = pool.submit(refuse_if_live, self.mailbox, self.node_id, self.lease_seconds,
                                      clock=self.clock.now, sleep=self.clock.sleep)  # fmt: skip
                latest = load_newest(self.mailbox, self.run, sleep=self.clock.sleep,
                                     own=lambda q: self.adapter.snapshot(self.plan[q]))  # fmt: skip
                refused.result()  # its error first: a node refused changes nothing
        if not created and not self.resume:
            refuse_resuming(self.raw_mailbox, self.run.run_id, [version for version, _ in latest.values()])
        for _, params in latest.values():
            self.adapter.assign(params)  # a joiner starts from the committed model
        self.rounds = self.algorithm.rounds(len(self.plan))
        self.courier = Courier(
            self.mailbox, self.run, self.algorithm, self.node_id, dict(latest), emit=self._emit,
            status=self._status, poll_seconds=self.poll_seconds, lease_seconds=self.lease_seconds,
            compression=self.compression, clock=self.clock, on_device=on_device_of(self.adapter),
        )  # fmt: skip
        return created, [version for version, _ in latest.values()]

    def _announce(self, created: bool, versions: list[int]) -> None:
        if created:
            self._emit(Event("run_created", self.node_id, f"created run {self.run.run_id[:8]} at versions "
                             f"{versions}", {"versions": versions}))  # fmt: skip
            return
        live = self.courier.live_nodes() - {self.node_id}  # the leases start() has just read
        self._emit(joined_event(self.mailbox, self.run, self.node_id, versions, live))

    def start(self) -> "Session":
        """Join the run, as entering `with` does; returns the session. Pair it with close()."""
        return self.__enter__()

    def close(self) -> None:
        """Leave the run, as leaving `with` without an exception does: wait for rounds in flight, up to
        close_timeout, then align the model with the newest commits. Closing again does nothing."""
        self.__exit__(None, None, None)

    def _say_if_plan_reduced(self) -> None:
        """A plan of fewer fragments than the method asked for is a warning: the run syncs bigger ones."""
        shortfall = getattr(self.algorithm, "plan_shortfall", None)
        found = shortfall(self.plan) if shortfall is not None else None
        if found is not None:
            asked, message = found
            self._emit(
                Event("plan_reduced", self.node_id, message, {"asked": asked, "fragments": len(self.plan)})
            )

    def __exit__(self, *exc: object) -> None:
        if self._state != "open":
            return
        self._state = "closing"
        try:
            if exc[0] is None:
                if self.courier.failure is not None and self.courier.failure is self._stall_error:
                    self.courier.failure = None  # raised once already; leaving still tries its best
                if self.island is not None:
                    self.island.closing = True  # every rank now asks rank 0 at each step, and reads its clock
                if (closing := getattr(self.courier, "closing", None)) is not None:
                    closing()  # the courier looks for the commits leaving waits for at a leaving node's pace
                self.node.finish(self.close_timeout)
        finally:
            self.courier.stop()
            self._state = "closed"
        if self.island is not None and exc[0] is None:
            self.island.left()  # the ranks leave together, once rank 0 has left the run
        self._emit(Event("left", self.node_id, f"left after {self.node.state.step} steps",
                         {"steps": self.node.state.step}))  # fmt: skip

    @property
    def is_open(self) -> bool:
        """Entered, and not yet left: steps, checkpoints and metrics are taken now."""
        return self._state == "open"

    # ---- the training thread's part ------------------------------------------------------------------

    def step(self, samples: int = 1) -> None:
        """Call after each optimizer step; `samples` is what that step trained on (sequences or tokens)."""
        if self._state != "open":
            raise SessionStateError(
                "session.step() was called outside the Session's `with` block; call it inside "
                "`with sl.Session(...) as session:`"
            )
        if type(samples) is not int or samples < 0:  # the common case costs one check
            samples = count_of(samples)
        if self.node.channel.failure is not None:  # (an island's rank 0 tells its other ranks first)
            raise self.node.channel.failure
        self.node.step(samples)

    def reset(self) -> None:
        """Say that the model was changed outside training, e.g. by `model.load_state_dict(...)` (which
        `Trainer(resume_from_checkpoint=...)` calls) inside the `with` block: otherwise the next contribution
        would publish the change as one huge pseudo-gradient into everyone's model.

        The synchronized tensors take the newest commits this node holds again (the run's model, as a
        joiner gets it), and the steps trained since the last sync are dropped (`steps_dropped`);
        what is not synchronized, optimizer and scheduler state included, stays as loaded. Contributions
        already published stay in flight and count if merged. The loaded weights themselves are not kept:
        a node trains the run's model, and every commit aligns it with it again (docs/guide/training.md).
        Call it between two steps, after the change. Frozen tensors are never sent, so a change that
        made them differ from the run's raises SchemaMismatch, naming the tensor, and nothing changes."""
        if self._state != "open":
            raise SessionStateError(
                "session.reset() was called outside the Session's `with` block; a model loaded before "
                "entering needs no reset (joining a run takes its committed model)"
            )
        compare_frozen(frozen_of(self.adapter), self.run.frozen)
        self.node.reset()

    # ---- what the communication thread and the user read ---------------------------------------------

    def _status(self) -> NodeStatus:
        node = self.node
        return NodeStatus(node.state.step, node.state.samples, node.step_seconds)

    def _key_ignored(self, key: str, reason: str) -> None:
        self._emit(Event("key_ignored", self.node_id, f"the mailbox ignores {key!r}: {reason}",
                         {"key": key, "reason": reason}))  # fmt: skip

    def _emit(self, event: Event) -> None:
        if event.kind == "contribution_sent":  # on the communication thread, once the upload landed
            self.node.sent(event.data["fragment"], event.data["round"], event.data.get("blob"))
        with self._count_lock:
            self._counts[event.kind] += 1
            if event.kind in ("steps_replaced", "steps_dropped", "steps_unconfirmed"):
                self._counts[event.kind + ":steps"] += event.data.get("steps", 0)
            if event.kind == "commit_applied":
                self._last_commit_at = self.clock.now()
            stalled = self._stall.heard(event, self.clock.now()) if self._stall is not None else None
        log_event(event)
        if self._events_file is not None:
            self._events_file(event)
        if self._on_event is not None:
            self._on_event(event)
        if stalled is not None:
            self._emit(stalled)
            if self.on_stall == "raise":  # the channel's failure: step() and its waits raise it
                self._stall_error = MailboxUnavailable(
                    f"{stalled.message}. on_stall='raise' stops training here; on_stall='warn' trains on alone"
                )
                self.courier.failure = self._stall_error

    @property
    def stats(self) -> SessionStats:
        counts, state = self._counts, self.node.state
        return SessionStats(
            node=self.node_id, step=state.step, samples=state.samples, versions=state.versions,
            commits_applied=counts["commit_applied"], rounds_merged=counts["round_merged"],
            contributions_sent=counts["contribution_sent"], contributions_late=counts["contribution_late"],
            contributions_rejected=counts["contribution_rejected"],
            own_contributions_rejected=counts["own_contribution_rejected"],
            contributions_refused=counts["contribution_refused"], syncs_deferred=counts["sync_deferred"],
            syncs_skipped=counts["sync_skipped"], steps_replaced=counts["steps_replaced:steps"],
            steps_dropped=counts["steps_dropped:steps"], steps_unconfirmed=counts["steps_unconfirmed:steps"],
            mailbox_errors=counts["mailbox_error"], uploads_failed=counts["upload_failed"],
            stalls=counts["stalled"],
            bytes_sent=getattr(self.courier, "bytes_sent", self.mailbox.bytes_sent), bytes_received=self.mailbox.bytes_received,
            requests=self.mailbox.total_requests, is_leader=self.courier.leadership.is_leader,
        )  # fmt: skip

    def metrics(self) -> dict[str, float | None]:
        """Figures for a dashboard, all numbers (the TensorBoard adapter in slowlink.ops logs them as they
        are): bytes and requests, rounds, seconds since the last commit applied (None before the first),
        staleness (commits known to this node but not yet applied; this node's steps not yet in any
        commit), and utilization (the share of wall time since joining spent outside session.step(),
        i.e. training rather than waiting for rounds or snapshotting)."""
        if self._state == "new":
            raise SessionStateError("session.metrics() is available once the Session is entered (`with`)")
        stats, node = self.stats, self.node
        wall = self.clock.now() - self._entered_at
        unmerged = [
            node.state.pending_steps(q) + (flight.steps if (flight := node.state.flights[q]) else 0)
            for q in range(len(self.plan))
        ]
        since_commit = None if self._last_commit_at is None else self.clock.now() - self._last_commit_at
        return {
            "step": stats.step, "samples": stats.samples, "bytes_sent": stats.bytes_sent,
            "bytes_received": stats.bytes_received, "requests": stats.requests,
            "commits_applied": stats.commits_applied, "rounds_merged": stats.rounds_merged,
            "contributions_sent": stats.contributions_sent, "contributions_late": stats.contributions_late,
            "contributions_rejected": stats.contributions_rejected, "seconds_since_commit": since_commit,
            "staleness_rounds": max((h - v for h, v in zip(self.courier.newest(), stats.versions, strict=True)), default=0),
            "staleness_steps": max(unmerged, default=0),
            "utilization": 1.0 - node.busy_seconds / wall if wall > 0 else 1.0,
            "step_seconds": node.step_seconds, "is_leader": int(stats.is_leader),
        }  # fmt: skip

    @property
    def batch_size(self) -> int:
        """This node's share of global_batch_size: divided by the nodes live now, rounded up. It follows the
        run's membership as nodes join and leave: read it again each step (or epoch), not once. Read right
        after joining, it first waits for the communication thread to read the leases once more, a couple
        of seconds after joining (at most three times that), so that nodes started at the same time count."""
        if self._state == "new":
            raise SessionStateError("session.batch_size is known once the Session is entered (`with`)")
        if self.rounds.global_batch_size is None:
            raise ConfigError(
                "session.batch_size needs DiLoCo(global_batch_size=...): the batch all nodes share"
            )
        settle = self.courier.watch_seconds  # long enough for nodes started with this one to write theirs
        deadline = self._entered_at + 3 * settle
        while self.courier.leases.reads <= self._leases_read_at_join and self.clock.now() < deadline:
            if self.clock.now() >= self._entered_at + settle:
                self.courier.request_leases()
            self.clock.sleep(min(0.01, settle / 10))
        return math.ceil(self.rounds.global_batch_size / len(self.courier.live_nodes()))


def _island_of(group: object) -> object:
    from .collective.island import Island  # torch: imported only for an island

    return group if isinstance(group, Island) else Island(group)
