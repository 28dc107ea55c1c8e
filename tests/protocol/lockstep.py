"""Real Couriers over one shared in-memory store, run in lockstep: each node on its own thread, parked before
every mailbox request until the test lets it go on, so a run is a function of the moves the test makes.
Nodes crash anywhere and restart from the store; their clocks move only when the test moves them.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from unittest import mock

import numpy as np

from slowlink.algorithms.diloco import DiLoCo
from slowlink.clock import VirtualClock
from slowlink.engine.channel import Contribution
from slowlink.errors import MailboxError, PayloadError, PreconditionFailed
from slowlink.mailbox.faulty import Faulty
from slowlink.mailbox.memory import MemoryMailbox
from slowlink.protocol import keys
from slowlink.protocol import run as run_module
from slowlink.protocol.chain import newest_params
from slowlink.protocol.courier import Courier, NodeStatus
from slowlink.protocol.run import Run, newest_versions, open_run

FRAGMENTS = 2
SCHEMA = [
    ("w0", (3, 4), "float32"),
    ("b0", (4,), "float32"),
    ("w1", (4, 2), "float32"),
    ("b1", (2,), "float32"),
]
SCHEMA_DIGEST = "0" * 64  # nodes only compare it
LEASE = 40.0  # seconds on the nodes' fake clocks
HANG_SECONDS = 30.0  # real seconds: a node that does not park again by then is stuck, a bug


class Ledger(MemoryMailbox):
    """The shared store: a MemoryMailbox that also logs every write it applied, in order, so that checks see
    the run's whole history, including what garbage collection deleted. Refused writes are not logged."""

    def __init__(self) -> None:
        super().__init__()
        # (verb, key, data): "put", "delete" (data None), or "kept" (a merger's own contribution, held in memory)
        self.writes: list[tuple[str, str, bytes | None]] = []
        self.commits_refused = 0  # create-once commit writes that found the round committed

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        try:
            etag = super().put(key, data, if_absent=if_absent, if_match=if_match)
        except PreconditionFailed:
            self.commits_refused += key.startswith("commits/")
            raise
        self.writes.append(("put", key, bytes(data)))
        return etag

    def delete(self, keys_: list[str]) -> None:
        super().delete(keys_)
        self.writes.extend(("delete", key, None) for key in keys_)


def create_run(ledger: Ledger, algorithm: DiLoCo) -> Run:
    """The run as its first node creates it, with a fixed run id: the id is in every payload's header, so in
    every blob's key, and Faulty picks its faults by key; a random id would make each run differ."""
    rng = np.random.default_rng(0)
    plan = algorithm.plan(SCHEMA)
    shapes = {name: shape for name, shape, _ in SCHEMA}
    initial = [{name: rng.normal(0, 1, shapes[name]).astype(np.float32) for name in group} for group in plan]
    with mock.patch.object(run_module.uuid, "uuid4", lambda: uuid.UUID(int=7)):
        run, _ = open_run(
            ledger,
            config=algorithm.to_dict(),
            schema=SCHEMA,
            schema_digest=SCHEMA_DIGEST,
            plan=plan,
            initial=lambda: initial,
        )
    return run


@dataclass
class Delivery:
    """A commit a node's Courier handed to its training thread: what that node adopted."""

    node: str
    life: int  # a restarted node is a new life, which starts again from the store
    fragment: int
    version: int
    params: dict


@dataclass
class World:
    """The store, the run, the nodes, and what the nodes did."""

    ledger: Ledger
    algorithm: DiLoCo
    run: Run
    nodes: list[Node] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    events: list = field(default_factory=list)
    samples: int = 0

    def new_samples(self) -> int:
        """A count of samples no contribution has reported yet: checks tell contributions apart by it."""
        self.samples += 1
        return self.samples


class Crash(BaseException):
    """Raised in a node's thread where it was about to send a request: the process died there. A
    BaseException, so that no `except` in the protocol takes it for a failed request."""


class LockstepMailbox:
    """What one node talks to: every request first parks the node until the test lets it go on."""

    def __init__(self, node: Node, inner: Faulty) -> None:
        self.node, self.inner = node, inner

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        self.node.park()
        return self.inner.put(key, data, if_absent=if_absent, if_match=if_match)

    def get(self, key: str, *, if_none_match: str | None = None, max_bytes: int | None = None):
        self.node.park()
        return self.inner.get(key, if_none_match=if_none_match, max_bytes=max_bytes)

    def list(self, prefix: str, *, start_after: str | None = None):
        self.node.park()
        return self.inner.list(prefix, start_after=start_after)

    def delete(self, keys_: list[str]) -> None:
        self.node.park()
        self.inner.delete(keys_)

    def clock(self) -> float:
        return self.inner.clock()


class Node:
    """One node on a thread of its own, parked at the start of each turn and before each mailbox request;
    only one node runs at a time. A turn is a join while the node holds no Courier (at first, and after a
    crash), else `Courier.turn()`."""

    def __init__(self, node_id: str, store: Faulty, world: World) -> None:
        self.node_id, self.world = node_id, world
        self.mailbox = LockstepMailbox(self, store)
        # A node's clock, moved only by the test: leases expire and grace windows end on demand. A restarted
        # process runs on the same machine: its clock goes on.
        self.clock = VirtualClock(1000.0)
        self.life = 0
        self.courier: Courier | None = None
        self.anchors: dict[int, tuple[int, dict]] = {}  # fragment -> the commit its training thread holds
        self.contributed: dict[int, int] = {}  # fragment -> the version its last contribution built on
        self.between_turns = False
        self.failure: BaseException | None = None
        self._go, self._parked = threading.Semaphore(0), threading.Semaphore(0)
        self._crashing = False
        self._start()

    # The node's thread.

    def park(self) -> None:
        self._parked.release()
        self._go.acquire()
        if self._crashing:
            raise Crash

    def _live(self) -> None:
        try:
            while True:
                self.between_turns = True
                self.park()
                self.between_turns = False
                try:
                    self._join() if self.courier is None else self.courier.turn()
                except (MailboxError, PayloadError):
                    pass  # as Courier's loop does: the next turn tries again
        except Crash:
            pass
        except BaseException as error:  # a bug in the protocol: raised again in the test's thread
            self.failure = error
        finally:
            self._parked.release()

    def _join(self) -> None:
        """What Session.__enter__ does: join the run, read head.json, probe past it, read the newest commits, make a Courier."""
        algorithm, mailbox = self.world.algorithm, self.mailbox
        run, _ = open_run(
            mailbox,
            config=algorithm.to_dict(),
            schema=SCHEMA,
            schema_digest=SCHEMA_DIGEST,
            plan=algorithm.plan(SCHEMA),
            initial=list,  # never called: the run exists
        )
        versions = newest_versions(mailbox, FRAGMENTS)
        latest = {q: newest_params(mailbox, run, q, version) for q, version in enumerate(versions)}
        courier = Courier(
            mailbox,
            run,
            algorithm,
            self.node_id,
            dict(latest),
            emit=self.world.events.append,
            status=lambda: NodeStatus(0, 0, 0.5),
            poll_seconds=1.0,
            lease_seconds=LEASE,
            compression=None,
            clock=self.clock,
            beat_seconds=0.0,  # a beat every turn: the test, not the time between turns, decides what is live
        )
        courier.merger.remember_own = self._logged_keep(courier.merger.remember_own)
        self.courier, self.anchors, self.contributed = courier, dict(latest), {}

    def _logged_keep(self, keep):
        """A merger keeps its own contribution in memory instead of writing it: the ledger logs it as "kept"
        at that moment, where a write would stand, so the checks see what the merger merges."""

        def remember_own(record: dict, data: bytes) -> None:
            key = keys.contribution(record["fragment"], record["round"], self.node_id)
            self.world.ledger.writes.append(("kept", key, bytes(data)))
            keep(record, data)

        return remember_own

    # The test's side.

    def _start(self) -> None:
        self.life += 1
        self._thread = threading.Thread(target=self._live, name=f"node-{self.node_id}", daemon=True)
        self._thread.start()
        self._wait_parked()

    def _wait_parked(self) -> None:
        assert self._parked.acquire(timeout=HANG_SECONDS), f"node {self.node_id} hangs"
        if self.failure is not None:
            raise self.failure

    def advance(self) -> None:
        """Let the node send the request it is parked at, and run on to its next one or to its turn's end."""
        self._go.release()
        self._wait_parked()
        self._take_deliveries()

    def finish_turn(self) -> None:
        self.advance()
        while not self.between_turns:
            self.advance()

    def _take_deliveries(self) -> None:
        while self.courier is not None and not self.courier.inbox.empty():
            alignment = self.courier.inbox.get_nowait()
            q, version = alignment.fragment, alignment.version
            self.world.deliveries.append(Delivery(self.node_id, self.life, q, version, alignment.params))
            if version > self.anchors[q][0]:
                self.anchors[q] = (version, alignment.params)

    def contribute(self, fragment: int, final: bool) -> None:
        """Queue a contribution on the training thread's anchor: anchor plus noise, as if it had trained."""
        if self.courier is None:
            return
        version, anchor = self.anchors[fragment]
        samples = self.world.new_samples()
        noise = np.random.default_rng(samples)
        snapshot = {
            name: (v + noise.normal(0, 0.1, v.shape)).astype(np.float32) for name, v in anchor.items()
        }
        contribution = Contribution(
            fragment=fragment,
            step=samples,
            base=version,
            anchor=anchor,
            snapshot=snapshot,
            steps=1 + samples % 3,
            samples=samples,
            final=final,
            step_seconds=0.5,
        )
        self.courier.publish(contribution)
        self.contributed[fragment] = version

    def train(self, final: bool) -> None:
        """What a training node does between two turns: contribute to each fragment whose newest commit it
        has not contributed on yet (final ones, as a node flushing its steps before it leaves)."""
        for fragment, (version, _) in sorted(self.anchors.items()):
            if self.courier is not None and self.contributed.get(fragment, -1) < version:
                self.contribute(fragment, final)

    def crash(self) -> None:
        """Kill the process wherever it is parked, mid-turn too; all it held in memory is lost."""
        self.stop()
        self.courier = None
        self._start()

    def stop(self) -> None:
        if self.failure is None:  # else the thread has ended already, raising the failure the test reports
            self._crashing = True
            self._go.release()
            self._wait_parked()  # the thread's last release, on its way out
            self._crashing = False
        self._thread.join(timeout=HANG_SECONDS)
        assert not self._thread.is_alive(), f"node {self.node_id} did not stop"
