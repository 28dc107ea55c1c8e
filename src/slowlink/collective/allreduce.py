"""DiLoCo and Streaming DiLoCo over a torch.distributed group: each rank is a node, and each fragment's round
is one collective of the ranks' pseudo-gradients (the quorum is every rank; there is no store).

`AllReduce(group)` goes where a mailbox would: `sl.Session(model, algorithm=sl.DiLoCo(...),
mailbox=sl.collective.AllReduce(group))`. The channel runs its rounds on its own thread, over its own group of
the same ranks (so a DDP all-reduce on the training thread never interleaves with it), in the order the
ranks' drivers publish, which the shared schedule makes the same on every rank; where the driver waits for
every round at once (overlap_steps=0) a round runs on the training thread instead, as it publishes, since a
thread would only add two wake-ups to the wait. With bits=None a round is one
float32 all-reduce of Σ w·Δ and Σ w (the method's merge must be WeightedMean); with bits=8 or 4 each rank's Δ
is quantized (collective/quantized.py), gathered, and merged by the method's own `combine`, every rank alike.
"""

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..algorithms.merge import WeightedMean
from ..algorithms.outer import RoundShape
from ..arrays import Arrays, subtract_into
from ..engine.channel import Arrival, Contribution
from ..errors import ConfigError
from ..events import Event
from ..frameworks.base import host_arrays, on_device_of
from .island import IslandStart, _NotLeading, refuse_sharded
from .quantized import all_gather_quantized


@dataclass(frozen=True)
class AllReduce:
    """A run whose nodes are the ranks of `group` (None: the default group). bits: None (float32), 8 or 4
    (each rank's pseudo-gradient quantized in blocks of `block` values, each block with a float32 scale)."""

    group: object = None
    bits: int | None = None
    block: int = 256

    def __post_init__(self) -> None:
        if self.bits not in (None, 8, 4):
            raise ConfigError(f"AllReduce(bits={self.bits!r}): bits must be None (float32), 8 or 4")
        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(
                "sl.collective.AllReduce needs an initialized process group: call "
                "torch.distributed.init_process_group(...) on every rank first (torchrun sets its environment)"
            )

    def enter(self, adapter, method, node_id: str, emit: Callable[[Event], None]) -> IslandStart:
        """Every rank starts from rank 0's model; the channel's own group is made here (all ranks at once)."""
        refuse_sharded(adapter)
        wire = method.wire()
        if (wire.delta_dtype or "F32") != "F32" or (wire.commit_dtype or "F32") != "F32":
            raise ConfigError(
                f"delta_dtype={wire.delta_dtype!r}, commit_dtype={wire.commit_dtype!r} choose a mailbox run's "
                "encodings; over a process group choose AllReduce(bits=8 or 4) instead, and leave them unset"
            )
        if self.bits is None and not isinstance(getattr(method, "merge", WeightedMean()), WeightedMean):
            raise ConfigError(
                f"merge={method.merge!r} needs every contribution on its own: use AllReduce(bits=8) (its rounds "
                "gather each rank's) or merge=sl.WeightedMean(), which a float32 all-reduce computes"
            )
        group = self.group if self.group is not None else dist.group.WORLD
        own = dist.new_group(dist.get_process_group_ranks(group), backend=dist.get_backend(group))
        plan = method.plan(adapter.schema)
        on_device = on_device_of(adapter)
        latest = {}
        for q, names in enumerate(plan):
            params = on_device({name: np.ascontiguousarray(a) for name, a in adapter.snapshot(names).items()})
            for name in names:
                dist.broadcast(params[name], src=dist.get_global_rank(group, 0), group=group)
            adapter.assign(params)
            latest[q] = (0, params)
        channel = RoundsOverGroup(own, self, method, plan, latest, on_device, node_id, emit)
        channel.inline = getattr(method, "overlap_steps", None) == 0
        return IslandStart(plan, channel, channel, latest, None, [0] * len(plan))


class RoundsOverGroup:
    """The channel (engine/channel.py) of AllReduce, and what the Session reads as its Courier."""

    leadership = _NotLeading()
    # Rounds run in publish(), on the caller's thread: for a driver that waits for each round at once.
    inline = False

    def __init__(
        self, group, options: AllReduce, method, plan, latest: dict, on_device, node_id: str, emit
    ) -> None:
        self.node_id, self.emit = node_id, emit
        self.group, self.options, self.method, self.plan, self.on_device = (
            group,
            options,
            method,
            plan,
            on_device,
        )
        self.ranks = dist.get_world_size(group)
        self.latest = {q: (v, host_arrays(params)) for q, (v, params) in latest.items()}  # host float32
        self.states = {q: method.init_state(params) for q, (_, params) in self.latest.items()}
        self.bytes_sent = 0  # what this rank put on the wire for the rounds, by the collectives' sizes
        self.outbox: queue.Queue[Contribution | None] = queue.Queue()
        self.inbox: queue.Queue[Arrival] = queue.Queue()
        self.failure: BaseException | None = None
        self.buffers: dict[int, torch.Tensor] = {}  # fragment -> the flat buffer its rounds all-reduce
        self._thread = threading.Thread(target=self._loop, name="slowlink-allreduce", daemon=True)

    def start(self) -> None:
        if not self.inline:
            self._thread.start()

    def stop(self) -> None:
        if not self.inline:
            self.outbox.put(None)
            self._thread.join()

    def publish(self, contribution: Contribution) -> None:
        if self.inline:
            self.inbox.put(self._round(contribution))
        else:
            self.outbox.put(contribution)

    def arrivals(self) -> list[Arrival]:
        found = []
        while not self.inbox.empty():
            found.append(self.inbox.get_nowait())
        return found

    def gather(self, deadline: float) -> Arrival | None:
        try:
            return self.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None

    def newest(self) -> list[int]:
        return [self.latest[q][0] for q in range(len(self.plan))]

    def live_nodes(self) -> set[str]:
        return {f"rank-{rank}" for rank in range(self.ranks)}

    def _loop(self) -> None:
        while (item := self.outbox.get()) is not None:
            try:
                self.inbox.put(self._round(item))
            except BaseException as error:  # a bug, or a rank gone: the training thread raises it
                self.failure = error
                return

    def _round(self, item: Contribution) -> Arrival:
        """Δ = anchor − snapshot, merged over the ranks, then the method's outer step, alike on every rank."""
        q, names, sent = item.fragment, self.plan[item.fragment], self.bytes_sent
        for name in names:
            subtract_into(item.anchor[name], item.snapshot[name])
        delta = {name: torch.as_tensor(item.snapshot[name]) for name in names}
        weight = float(self.method.weight(item.samples, item.steps))
        merged = self._merge(delta, weight) if self.options.bits is not None else self._sum(q, delta, weight)
        version, anchor = self.latest[q]
        params, self.states[q] = self.method.outer_step(
            merged, self.states[q], anchor, flush_only=item.final, shape=RoundShape(self.ranks, self.ranks)
        )
        self.latest[q] = (version + 1, params)
        self.emit(Event("contribution_sent", self.node_id, f"fragment {q} round {version + 1}: {item.steps} steps, "
                        f"merged over {self.ranks} ranks", {"fragment": q, "round": version + 1, "step": item.step,
                        "steps": item.steps, "bytes": self.bytes_sent - sent}))  # fmt: skip
        return Arrival(q, version + 1, self.on_device(params), "merged")

    def _sum(self, fragment: int, delta: dict[str, torch.Tensor], weight: float) -> Arrays:
        """Σ w·Δ / Σ w by one all-reduce of the fragment as one flat float32 buffer (its weight at the end),
        written and read in one pass each: the merged Δ is views into the reduced buffer. The buffer is the
        fragment's own, kept from round to round (fresh memory costs a page fault per page on a CPU): the
        outer step only reads the merged Δ, and its round is over before the fragment's next one starts."""
        sizes = [values.numel() for values in delta.values()]
        first = next(iter(delta.values()))
        flat = self.buffers.get(fragment)
        if flat is None:
            flat = torch.empty(sum(sizes) + 1, dtype=torch.float32, device=first.device)
            self.buffers[fragment] = flat
        at = 0
        for values, size in zip(delta.values(), sizes, strict=True):
            torch.mul(values.reshape(-1), weight, out=flat[at : at + size])
            at += size
        flat[-1] = weight
        dist.all_reduce(flat, group=self.group)
        self.bytes_sent += 2 * (self.ranks - 1) * flat.numel() * 4 // self.ranks  # a ring's share
        total = flat.cpu().numpy()
        total[:-1] /= total[-1]
        out, at = {}, 0
        for (name, values), size in zip(delta.items(), sizes, strict=True):
            out[name] = total[at : at + size].reshape(values.shape)
            at += size
        return out

    def _merge(self, delta: dict[str, torch.Tensor], weight: float) -> Arrays:
        """Each rank's Δ, quantized and gathered, merged by the method's own combine in rank order."""
        weights = torch.tensor([weight], dtype=torch.float64)
        rows = [torch.empty_like(weights) for _ in range(self.ranks)]
        dist.all_gather(rows, weights, group=self.group)
        per_rank: list[Arrays] = [{} for _ in range(self.ranks)]
        for name, values in delta.items():
            gathered = all_gather_quantized(values, self.options.bits, self.group, self.options.block)
            for rank, got in enumerate(gathered):
                per_rank[rank][name] = got.cpu().numpy()
            per_value = self.options.bits / 8 + 4 / self.options.block
            self.bytes_sent += int((self.ranks - 1) * values.numel() * per_value)
        return self.method.combine((arrays, float(w)) for arrays, w in zip(per_rank, rows, strict=True))
