"""An island: the ranks of a torch.distributed group (a torchrun job, with DDP or without) trained as one node.

Rank 0 is the node's voice: its Session talks to the mailbox as any node's does, and no other rank does. Every
rank runs the same driver (engine/node.py) in lockstep: the driver asks its channel for news each step, and rank
0 answers every few asks (about every CHECK_SECONDS) with what its channel delivered (mostly nothing: one
tensor of five numbers), the commits themselves and its clock reading, so every rank applies the same commits
at the same steps and decides each wait alike.
A contribution is the island's snapshot: a replicated tensor's mean over the ranks (DDP), a sharded one's Δ
rows from each rank, encoded by rank 0 tensor by tensor (FSDP2); a commit goes back the same way
(collective/shards.py).
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from ..arrays import subtract_into
from ..clock import REAL
from ..engine.channel import Arrival, Contribution, Refused
from ..errors import ConfigError, SlowlinkError, TrainingDiverged
from ..frameworks.base import on_device_of, schema_digest
from .shards import Layout, StreamedEncoding

ARRIVALS, GATHER = 1.0, 2.0  # which call of the driver a message answers
CHECK_SECONDS = 0.05  # how often, in steps' time, rank 0 answers the driver's ask for news
MAX_GAP = 10_000
COMMIT, REFUSAL = 1, 2
JOINED, JOIN_FAILED = -1.0, -2.0  # rank 0's last word while it joins; a number >= 0 asks for a tensor's rows
FATES = (None, "merged", "rejected", "missed")


class IslandLeadFailed(SlowlinkError):
    """Rank 0 of an island stopped on an error (its own traceback says which); the other ranks stop too."""


class Island:
    """The group an island's ranks share, and the few collectives its lockstep needs. Messages go over a
    gloo group (the group itself where it is gloo, else a gloo group of the same ranks, so that reading a
    message never waits for an accelerator); tensors of the model go over the group itself."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(
                "island= needs an initialized process group: call torch.distributed.init_process_group(...) "
                "on every rank first (torchrun sets its environment), then pass island=torch.distributed.group.WORLD"
            )
        self.group = group if group is not None else dist.group.WORLD
        self.rank, self.size = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.root = dist.get_global_rank(self.group, 0)
        gloo = dist.get_backend(self.group) == "gloo"
        self.control = (
            self.group if gloo else dist.new_group(dist.get_process_group_ranks(self.group), backend="gloo")
        )
        self.stamp = 0.0  # rank 0's clock at its last message: the time every rank's driver reads on leaving
        # The driver asks for news once a step; rank 0 answers every `gap`-th ask (its choice, told with each
        # answer), about every CHECK_SECONDS, and at every ask once the Session is leaving (`closing`).
        self.asks, self.next_answer, self.closing = 0, 0, False
        self.answered_at, self.answered_ask = 0.0, 0
        self.messages = 0  # broadcasts of news, for the benchmark of their cost
        self.layout: Layout | None = None  # how the ranks hold each tensor: set as they enter (enter_island)

    @property
    def is_lead(self) -> bool:
        return self.rank == 0

    def unanswered(self) -> bool:
        """Count an ask for news; True if rank 0 sends no answer to this one (every rank counts alike)."""
        self.asks += 1
        return not self.closing and self.asks < self.next_answer

    def gap(self, now: float) -> int:
        """Rank 0's choice of asks until the next answer: about CHECK_SECONDS of this island's steps."""
        per_ask = (now - self.answered_at) / max(1, self.asks - self.answered_ask)
        self.answered_at, self.answered_ask = now, self.asks
        return max(1, min(MAX_GAP, int(CHECK_SECONDS / per_ask) if per_ask > 0 else 1))

    def left(self) -> None:
        """Rank 0 has left the run (its Courier stopped); the others wait for its word, so that no rank tears
        the group down while rank 0 still finishes its last requests."""
        self.say([1.0] if self.is_lead else None, 1)

    def say(self, values: list[float] | None, length: int) -> list[float]:
        """Rank 0's numbers (float64), broadcast to every rank; the others pass None."""
        tensor = (
            torch.tensor(values, dtype=torch.float64)
            if values is not None
            else torch.empty(length, dtype=torch.float64)
        )
        dist.broadcast(tensor, src=self.root, group=self.control)
        return tensor.tolist()

    def say_text(self, text: str | None) -> str:
        data = text.encode() if text is not None else b""
        (length,) = self.say([float(len(data))] if text is not None else None, 1)
        raw = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if text is not None
            else torch.empty(int(length), dtype=torch.uint8)
        )
        if length:
            dist.broadcast(raw, src=self.root, group=self.control)
        return bytes(raw.tolist()).decode(errors="replace")

    def total(self, value: float) -> float:
        tensor = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(tensor, group=self.control)
        return tensor.item()

    def require_same(self, digest: str) -> None:
        """Every rank trains the same tensors: a SchemaMismatch-like error on all ranks naming the first that
        differs from rank 0, raised on every rank so none waits for the others."""
        mine = torch.frombuffer(bytearray(bytes.fromhex(digest)), dtype=torch.uint8)
        rows = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(rows, mine, group=self.control)
        differ = [rank for rank, row in enumerate(rows) if not torch.equal(row, rows[0])]
        if differ:
            raise ConfigError(
                f"island rank {differ[0]} synchronizes other tensors than rank 0 (schema digest "
                f"{rows[differ[0]].numpy().tobytes().hex()[:12]}… against {rows[0].numpy().tobytes().hex()[:12]}…): every "
                "rank must build the same model, wrapped the same way, with the same params="
            )

    def start(self, plan: list[list[str]], latest: dict | None) -> dict[int, tuple[int, dict]]:
        """Rank 0's commits to start from (fragment -> (version, params)), each rank's part of them on its
        device; the others pass latest=None."""
        versions = self.say(
            [float(latest[q][0]) for q in range(len(plan))] if latest is not None else None, len(plan)
        )
        self.stamp = self.say([REAL.now()] if latest is not None else None, 1)[0]
        return {
            q: (int(v), self.layout.share(latest[q][1] if latest is not None else None, plan[q]))
            for q, v in enumerate(versions)
        }


class IslandClock:
    """The time an island's drivers read: their own while training (it only times steps), and rank 0's, as
    of its last message, once leaving, so that every rank's deadline for rounds in flight, the one decision
    the driver takes by the clock, comes out alike. Waits are real."""

    def __init__(self, island: Island) -> None:
        self.island = island

    def now(self) -> float:
        return self.island.stamp if self.island.closing else REAL.now()

    def sleep(self, seconds: float) -> None:
        REAL.sleep(seconds)

    def wait(self, event, seconds: float) -> bool:
        return REAL.wait(event, seconds)


class _NotLeading:
    is_leader = False  # a follower never merges (the Session's stats read it)


class IslandLead:
    """Rank 0's channel: the mailbox's (its Courier), with every answer it gives the driver told to the
    other ranks, and every contribution first averaged over the island."""

    failure = None  # the Courier's failure is told to every rank with the next news, then raised

    def __init__(self, island: Island, inner, plan: list[list[str]]) -> None:
        self.island, self.inner, self.plan = island, inner, plan
        # A Δ that cannot be encoded (not finite): told to every rank as a failure of the Courier's would be.
        self.diverged: BaseException | None = None

    def publish(self, contribution: Contribution) -> None:
        layout = self.island.layout
        contribution.samples = int(self.island.total(contribution.samples))
        if not layout.sharded:  # the Courier makes Δ of the ranks' mean, on the model's device
            layout.average(contribution.snapshot)
            self.inner.publish(contribution)
            return
        # Sharded: each rank makes Δ of its rows; rank 0 receives them and encodes the fragment tensor by
        # tensor, so that it never holds a whole fragment, only its encoding (the payload's contents).
        streamed = StreamedEncoding(self.inner, contribution.fragment, list(contribution.snapshot))
        layout.deltas(contribution.snapshot, contribution.anchor, streamed.take)
        try:
            prepared = self.inner.frame(contribution, contribution.base + 1, streamed.norm(), streamed.result)
        except TrainingDiverged as error:
            self.diverged = error
            return
        if prepared is not None:  # else refused: the Courier queued the refusal for the driver
            self.inner.publish(replace(contribution, prepared=prepared))

    def arrivals(self) -> list[Arrival | Refused]:
        if self.island.unanswered():
            return []  # what came waits in the Courier's queue for the next answer (or a τ wait's gather)
        self._check()
        return self._tell(ARRIVALS, self.inner.arrivals())

    def gather(self, deadline: float) -> Arrival | Refused | None:
        self._check()
        found = self.inner.gather(deadline)
        told = self._tell(GATHER, [found] if found is not None else [])
        return told[0] if told else None

    def live_nodes(self) -> set[str]:
        return self.inner.live_nodes()

    def newest(self) -> list[int]:
        return self.inner.newest()

    def _check(self) -> None:
        if (failure := self.inner.failure or self.diverged) is not None:
            self.island.stamp = REAL.now()
            self.island.say([ARRIVALS, 0.0, 1.0, self.island.stamp, 1.0], 5)
            raise failure

    def _tell(self, kind: float, found: list) -> list[Arrival | Refused]:
        """Tell the other ranks what came; what this rank's driver gets: each commit's part it holds."""
        self.island.stamp = now = REAL.now()
        self.island.messages += 1
        gap = self.island.gap(now) if kind == ARRIVALS else self.island.next_answer - self.island.asks
        self.island.next_answer = self.island.asks + gap
        self.island.say([kind, float(len(found)), 0.0, now, float(gap)], 5)
        told = []
        for item in found:
            if isinstance(item, Refused):
                self.island.say([REFUSAL, item.fragment, item.round, 0.0], 4)
                self.island.say_text(item.reason)
                told.append(item)
                continue
            self.island.say([COMMIT, item.fragment, item.version, FATES.index(item.mine)], 4)
            if item.mine == "rejected":
                self.island.say_text(item.rejected or "")
            mine = self.island.layout.share(item.params, self.plan[item.fragment])
            told.append(replace(item, params=mine))
        return told


class IslandFollower:
    """Any other rank's channel: it hears rank 0's answers and takes part in the island's averages; it has
    no mailbox. It also stands in for the Courier where the Session reads one."""

    failure = None
    leadership = _NotLeading()

    def __init__(self, island: Island, plan: list[list[str]], versions: list[int]) -> None:
        self.island, self.plan, self.versions = island, plan, list(versions)

    def publish(self, contribution: Contribution) -> None:
        layout = self.island.layout
        self.island.total(contribution.samples)
        if layout.sharded:
            layout.deltas(contribution.snapshot, contribution.anchor)
            return
        layout.average(contribution.snapshot)
        # Δ = anchor − snapshot, as rank 0's Courier makes it of the same mean
        for name, values in contribution.snapshot.items():
            subtract_into(contribution.anchor[name], values)

    def arrivals(self) -> list[Arrival | Refused]:
        return [] if self.island.unanswered() else self._hear(ARRIVALS)

    def gather(self, deadline: float) -> Arrival | Refused | None:
        del deadline  # rank 0 waits; this rank waits for its word
        found = self._hear(GATHER)
        return found[0] if found else None

    def newest(self) -> list[int]:
        return list(self.versions)

    def live_nodes(self) -> set[str]:
        raise ConfigError(
            "the run's live nodes are known to rank 0 of an island only: read session.batch_size on rank 0 "
            "and broadcast it, or give every rank its share of the batch yourself"
        )

    def start(self) -> None:
        """Nothing to start: this rank has no communication thread."""

    def stop(self) -> None:
        """Nothing to stop."""

    def _hear(self, kind: float) -> list[Arrival | Refused]:
        said, count, failed, self.island.stamp, gap = self.island.say(None, 5)
        self.island.next_answer = self.island.asks + int(gap)
        if failed:
            raise IslandLeadFailed(
                "rank 0 of this island stopped on an error (its log says which); this rank stops too"
            )
        if said != kind:
            raise AssertionError(
                f"island out of lockstep: rank 0 answered call {said}, this rank made call {kind}"
            )
        found = []
        for _ in range(int(count)):
            what, fragment, version, fate = (int(x) for x in self.island.say(None, 4))
            if what == REFUSAL:
                found.append(Refused(fragment, version, self.island.say_text(None)))
                continue
            rejected = self.island.say_text(None) if FATES[fate] == "rejected" else None
            params = self.island.layout.share(None, self.plan[fragment])
            self.versions[fragment] = max(self.versions[fragment], version)
            found.append(Arrival(fragment, version, params, FATES[fate], rejected))
        return found


def refuse_sharded(adapter, *, dtensors: bool = True) -> None:
    """FSDP's sharded parameters where they cannot be synchronized, refused on every rank alike (each finds
    them itself, so none waits): FSDP1's flat parameters anywhere, FSDP2's DTensors unless `dtensors=False`
    (an island takes them through its sharded adapter, collective/shards.py)."""
    model = getattr(adapter, "model", None)
    if model is not None and any(cls.__name__ == "FullyShardedDataParallel" for cls in type(model).__mro__):
        raise ConfigError(
            "the model is wrapped in FSDP1 (FullyShardedDataParallel), whose flat sharded parameters are not the "
            "model's tensors: slowlink cannot synchronize them (docs/islands.md); shard it with FSDP2's "
            "torch.distributed.fsdp.fully_shard, or wrap it with DistributedDataParallel inside the island"
        )
    for name, tensor in getattr(adapter, "tensors", {}).items() if dtensors else ():
        if "DTensor" in {cls.__name__ for cls in type(tensor).__mro__}:
            raise ConfigError(
                f"tensor {name!r} is a DTensor, sharded by FSDP's fully_shard: DiLoCo over a process group "
                "needs every rank's whole tensors; make a sharded group one node with sl.Session(..., "
                "island=group) instead (docs/islands.md, 'An island with FSDP')"
            )


@dataclass
class IslandStart:
    """What an island's rank enters the Session with: the plan, what the Session reads as its Courier, the
    driver's channel, its anchors (fragment -> (version, params)), and for rank 0 whether it created the run."""

    plan: list[list[str]]
    courier: object
    channel: object
    anchors: dict
    created: bool | None
    versions: list[int]


def enter_island(island: Island, adapter, algorithm, join: Callable, courier: Callable) -> IslandStart:
    """Rank 0 joins the mailbox (`join()`, the Session's own, then `courier()` is its Courier) and tells the
    other ranks its commits; they take them into their models. Every rank checks first that all train the
    same tensors; if rank 0 cannot join, the others stop with it. With sharded tensors (FSDP2) rank 0 joins
    with whole tensors gathered on its host one at a time as it needs them (collective/shards.py), then
    every rank takes its shard of the commits."""
    refuse_sharded(adapter, dtensors=False)
    island.require_same(schema_digest(adapter.schema))
    island.layout = getattr(adapter, "layout", None) or replicated(island, adapter)
    if (begin_join := getattr(adapter, "begin_join", None)) is not None:
        begin_join()
    if not island.is_lead:
        follow_join(island, adapter)
        plan = algorithm.plan(adapter.schema)
        anchors = island.start(plan, None)
        for _, params in anchors.values():
            adapter.assign(params)  # rank 0's model: the run's, as it joined
        versions = [anchors[q][0] for q in range(len(plan))]
        follower = IslandFollower(island, plan, versions)
        return IslandStart(plan, follower, follower, anchors, None, versions)
    try:
        created, versions = join()
    except BaseException:
        island.say([JOIN_FAILED], 1)  # the others wait for rank 0's word: tell them it has none
        raise
    island.say([JOINED], 1)
    lead = courier()
    plan, latest = lead.run.plan, lead.anchors()
    anchors = island.start(plan, latest)
    if island.layout.sharded:  # rank 0 too now trains its shard, of the commits it joined at
        adapter.joined()
        for _, params in anchors.values():
            adapter.assign(params)
    return IslandStart(plan, lead, IslandLead(island, lead, plan), anchors, created, versions)


def follow_join(island: Island, adapter) -> None:
    """Any other rank while rank 0 joins: send it the rows of each tensor it asks for, until it has joined;
    IslandLeadFailed if it could not."""
    while True:
        (word,) = island.say(None, 1)
        if word == JOINED:
            return
        if word == JOIN_FAILED:
            raise IslandLeadFailed(
                "rank 0 of this island could not join the run (its traceback says why); this rank stops too"
            )
        adapter.send(int(word))


def replicated(island: Island, adapter) -> Layout:
    """The layout of a model every rank holds whole (DDP, or none): a commit lands on the model's device."""
    on_device = on_device_of(adapter)
    shapes = {name: shape for name, shape, _ in adapter.schema}
    return Layout(island, {}, shapes, lambda name, values: on_device({name: values})[name])
