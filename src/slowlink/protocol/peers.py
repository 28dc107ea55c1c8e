"""The peer exchange of gossip methods over a mailbox (engine/peers.py): no merger, no socket. Each node PUTs
its values under its own key, and its group members GET that key by name (no LIST, ever); a communication
thread does every request, so publishing never blocks the training thread and a non-blocking collect only
reads what that thread has fetched.

gossip/ranks/<k>.json                       create-once: the node holding rank k of the roster
gossip/<round>/<carries>/<rank>.safetensors a node's values for one exchange of a round (overwritten)
A payload is checked (run, schema, round, exact tensors, finite values) before it is mixed; one that fails
is handed back as its reason, and the node mixes without it.
"""

import math
import threading
from collections import Counter

from ..algorithms.gossip import START
from ..arrays import Arrays
from ..clock import REAL, Clock
from ..engine.peers import LATE
from ..errors import ConfigError, MailboxError, PayloadError, PreconditionFailed
from ..events import Event
from ..mailbox.contract import Mailbox
from ..wire import payload
from . import records
from .run import Run

MAX_POLL_SECONDS = 1.0  # the longest pause between two turns of GETs while nothing comes


def rank_key(rank: int) -> str:
    return f"gossip/ranks/{rank:04d}.json"


def values_key(round_: int, carries: str, rank: int) -> str:
    return f"gossip/{round_:08d}/{carries}/{rank:04d}.safetensors"


def claim_rank(mailbox: Mailbox, node_id: str, nodes: int) -> int:
    """This node's rank: the slot that already names it (a restart), else the first free one, taken
    create-once; at most 2·nodes requests. ConfigError when every slot holds another node."""
    holders = {}
    for rank in range(nodes):
        found = mailbox.get(rank_key(rank), max_bytes=records.READ_LIMIT)
        if found is not None and found.data is not None:
            holders[rank] = records.decode(found.data, {"node": records.NODE}, what=rank_key(rank))["node"]
            if holders[rank] == node_id:
                return rank
    for rank in range(nodes):
        if rank in holders:
            continue
        try:
            mailbox.put(rank_key(rank), records.encode({"node": node_id}), if_absent=True)
            return rank
        except PreconditionFailed:
            continue  # another node took it a moment ago
    raise ConfigError(
        f"this gossip run has nodes={nodes} ranks, all held by other nodes ({sorted(holders.values())[:8]}): "
        f"start at most {nodes} nodes, or a new run with a larger nodes="
    )


class MailboxPeers:
    """One node's side of the exchange; `start()` runs its communication thread, `stop()` ends it."""

    def __init__(
        self, mailbox: Mailbox, run: Run, rank: int, nodes: int, *, node_id: str, emit, clock: Clock = REAL,
        poll_seconds: float = 0.05,
    ) -> None:  # fmt: skip
        self.mailbox, self.run, self.rank, self.nodes = mailbox, run, rank, nodes
        self.node_id, self.emit, self.clock, self.poll_seconds = node_id, emit, clock, poll_seconds
        self.shapes = {name: tuple(shape) for name, shape, _ in run.schema}
        self.failure: BaseException | None = None
        self.bytes_sent: Counter = Counter()  # "blocking" and "non_blocking"
        self.bytes_received = 0
        self._outbox: list[tuple[int, str, Arrays]] = []
        self._wanted: dict[tuple[int, str, int], tuple[str, ...]] = {}  # key -> the tensors it must hold
        self._got: dict[tuple[int, str, int], Arrays | str] = {}
        self._delete: list[str] = []
        self._changed = threading.Condition()
        self._stopping = False
        self._waiting = 0  # training threads inside collect(): the communication thread polls fast meanwhile
        self._thread = threading.Thread(target=self._serve, name=f"slowlink-gossip-{node_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._thread.join(timeout=30)

    # ---- the training thread's calls (engine/peers.py) ------------------------------------------------

    def publish(self, round_: int, carries: str, group: tuple[int, ...], arrays: Arrays) -> None:
        with self._changed:
            self._outbox.append((round_, carries, arrays))
            for other in group:
                if other != self.rank:
                    self._wanted[(round_, carries, other)] = tuple(arrays)
            self._changed.notify_all()

    def collect(
        self, round_: int, carries: str, group: tuple[int, ...], deadline: float
    ) -> dict[int, Arrays | str]:
        wanted = [(round_, carries, other) for other in group if other != self.rank]
        with self._changed:
            self._waiting += 1
            self._changed.notify_all()
            try:
                while not all(key in self._got for key in wanted) and self.failure is None:
                    left = deadline - self.clock.now()
                    if left <= 0:
                        break
                    self._changed.wait(min(left, 0.05))
            finally:
                self._waiting -= 1
            return {key[2]: self._got.get(key, LATE) for key in wanted}

    def forget(self, before: int) -> None:
        """Drop what rounds before `before` fetched, and delete this node's own keys of rounds before
        before − 1 (a slow partner may still read the last one)."""
        with self._changed:
            for key in [key for key in self._got if key[0] < before]:
                del self._got[key]
            for key in [key for key in self._wanted if key[0] < before]:
                del self._wanted[key]
            old = before - 2
            if old >= 0:
                self._delete += [values_key(old, carries, self.rank) for carries in ("start", "delta")]

    # ---- the communication thread ---------------------------------------------------------------------

    def _serve(self) -> None:
        pause = self.poll_seconds
        try:
            while True:
                with self._changed:
                    if self._stopping and not self._outbox:
                        return
                    outbox, self._outbox = self._outbox, []
                    doomed, self._delete = self._delete, []
                    pending = [(key, names) for key, names in self._wanted.items() if key not in self._got]
                for round_, carries, arrays in outbox:
                    self._put(round_, carries, arrays)
                if doomed:
                    self.mailbox.delete(doomed)
                fetched = {
                    key: answer for key, names in pending if (answer := self._fetch(key, names)) is not None
                }
                with self._changed:
                    self._got.update({key: a for key, a in fetched.items() if key in self._wanted})
                    self._changed.notify_all()
                    # Quiet turns back off (1.25× each, up to MAX_POLL_SECONDS), so partners that are still
                    # training cost few GETs; news, or a training thread waiting on a blocking mix, polls fast.
                    quiet = not outbox and not fetched and not self._waiting
                    pause = min(pause * 1.25, MAX_POLL_SECONDS) if quiet else self.poll_seconds
                    if not self._outbox and not self._stopping:
                        self._changed.wait(pause)
        except BaseException as error:  # a bug, or a store that fails for good: raised on the training thread
            self.failure = error
            with self._changed:
                self._changed.notify_all()

    def _put(self, round_: int, carries: str, arrays: Arrays) -> None:
        header = {"run": self.run.run_id, "schema": self.run.schema_digest, "kind": "gossip", "round": round_,
                  "carries": carries, "rank": self.rank}  # fmt: skip
        data = payload.pack(arrays, header)
        for attempt in range(5):
            try:
                self.mailbox.put(values_key(round_, carries, self.rank), data)
                self.bytes_sent["non_blocking" if carries == START else "blocking"] += len(data)
                return
            except MailboxError as error:
                self.emit(Event("mailbox_error", self.node_id, f"gossip upload failed ({error}); retrying",
                                {"attempt": attempt}))  # fmt: skip
                self.clock.sleep(self.poll_seconds * 2**attempt)

    def _fetch(self, key: tuple[int, str, int], names: tuple[str, ...]) -> Arrays | str | None:
        """The partner's values, a reason they cannot be mixed, or None if not there yet."""
        round_, carries, rank = key
        try:
            found = self.mailbox.get(values_key(round_, carries, rank), max_bytes=self._limit(names))
        except PayloadError as error:  # over the size the run's tensors can take
            return f"corrupt: {error}"
        except MailboxError:
            return None  # tried again on the next turn
        if found is None or found.data is None:
            return None
        self.bytes_received += len(found.data)
        try:
            arrays, _ = payload.unpack(
                found.data, max_bytes=self._limit(names), expect_shapes={n: self.shapes[n] for n in names},
                expect={"run": self.run.run_id, "schema": self.run.schema_digest, "kind": "gossip",
                        "round": round_, "carries": carries, "rank": rank},
            )  # fmt: skip
        except PayloadError as error:
            why = str(error)
            return (
                f"schema: {why}"
                if "shape" in why or "tensor" in why or "schema" in why
                else f"corrupt: {why}"
            )
        return arrays

    def _limit(self, names: tuple[str, ...]) -> int:
        values = sum(int(math.prod(self.shapes[n])) for n in names)
        return 4 * values + (1 << 20)  # float32 values and a generous header
