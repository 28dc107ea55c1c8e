"""How an island's ranks hold each tensor, and the two moves of a round over them: a contribution to rank 0 and
a commit back to every rank. A tensor is replicated (DDP: every rank has all of it; the contribution is the
ranks' mean, a commit is broadcast) or sharded by rows (FSDP2's fully_shard: each rank has its rows and makes
Δ of them; rank 0 receives one tensor's rows at a time on the host and encodes it at once, and a commit's rows
go to each rank, so no accelerator holds more than its shard, and rank 0 no more than a tensor beyond the
payload it sends).
"""

import copy
import math
import warnings
from collections.abc import Mapping

import numpy as np
import torch
import torch.distributed as dist

from ..algorithms.robust import l2_norm
from ..arrays import Arrays, subtract_into
from ..errors import ConfigError, PayloadError
from ..wire.fragment import encode_fragment


def _is_dtensor(tensor) -> bool:
    return any(cls.__name__ == "DTensor" for cls in type(tensor).__mro__)


def chunk_rows(length: int, ranks: int) -> list[tuple[int, int]]:
    """The rows [start, stop) of dim 0 each rank holds under torch.chunk, as FSDP2 shards: ceil(n / N) each,
    the last ranks fewer (or none)."""
    size = math.ceil(length / ranks) if length else 0
    return [(min(length, r * size), min(length, (r + 1) * size)) for r in range(ranks)]


class LocalShards(Mapping):
    """Each tensor's part on this rank, looked up at every use: FSDP2 re-points a parameter's local shard
    when it first runs, so a shard taken before training would go stale."""

    def __init__(self, tensors: dict) -> None:
        self.whole = tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self.whole[name]
        return tensor.to_local() if _is_dtensor(tensor) else tensor

    def __iter__(self):
        return iter(self.whole)

    def __len__(self) -> int:
        return len(self.whole)


class Layout:
    """Which tensors are sharded, by which rows on each rank (`rows`), in an island (collective/island.py);
    every other tensor is replicated. Messages of the sharded rows go over the island's gloo group, by host."""

    def __init__(self, island, rows: dict[str, list[tuple[int, int]]], shapes: dict, device_of) -> None:
        self.island, self.rows, self.shapes, self.device_of = island, rows, shapes, device_of

    @property
    def sharded(self) -> bool:
        return bool(self.rows)

    def own_rows(self, name: str) -> tuple[int, int]:
        return self.rows[name][self.island.rank]

    def average(self, snapshot: Arrays) -> None:
        """Every rank at once: the replicated tensors of `snapshot` averaged in place over the ranks."""
        for name, values in snapshot.items():
            if name not in self.rows:
                tensor = _as_tensor(values)
                dist.all_reduce(tensor, group=self.island.group)
                tensor /= self.island.size

    def deltas(self, snapshot: Arrays, anchor: Arrays, take=None) -> None:
        """Every rank at once, tensor by tensor: Δ = anchor − snapshot in place of each rank's snapshot (a
        replicated tensor's snapshot averaged over the ranks first). Rank 0 passes `take`, called with each
        tensor's whole Δ on its host in turn, its rows received from the other ranks then: rank 0 never holds
        more than one tensor of the fragment whole."""
        for name, values in snapshot.items():
            if name not in self.rows:
                self.average({name: values})
                subtract_into(anchor[name], values)
                if take is not None:
                    take(name, host_float32(values))
                continue
            subtract_into(anchor[name], values)
            if take is None:
                self.send_rows(name, values)
            else:
                take(name, self.whole(name, values))

    def send_rows(self, name: str, values) -> None:
        """A rank's rows of a sharded tensor, to rank 0 (its `whole`)."""
        mine = host_float32(values)
        if mine.size:
            dist.send(torch.from_numpy(mine), group=self.island.control, group_dst=0)

    def whole(self, name: str, mine) -> np.ndarray:
        """Rank 0: a sharded tensor whole on the host, its own rows `mine` and every other rank's (send_rows)."""
        full = np.empty(self.shapes[name], np.float32)
        for rank, (start, stop) in enumerate(self.rows[name]):
            rows = torch.from_numpy(full[start:stop])
            if rank == 0:
                rows.copy_(_as_tensor(mine).detach().to("cpu", torch.float32))
            elif stop > start:
                dist.recv(rows, group=self.island.control, group_src=rank)
        return full

    def share(self, params: Arrays | None, names: list[str]) -> dict[str, torch.Tensor]:
        """Every rank at once: rank 0's `params` (the others pass None), each rank's part of them on its
        device: replicated tensors broadcast whole, sharded ones each rank's rows only."""
        island, out = self.island, {}
        for name in names:
            if name not in self.rows:
                tensor = (
                    _as_tensor(params[name])
                    if params is not None
                    else self.device_of(name, np.zeros(self.shapes[name], np.float32))
                )
                dist.broadcast(tensor, src=island.root, group=island.group)
                out[name] = tensor
                continue
            start, stop = self.own_rows(name)
            if params is not None:
                full = host_float32(params[name])
                for rank, (a, b) in enumerate(self.rows[name][1:], start=1):
                    if b > a:
                        dist.send(_read_only(full[a:b]), group=island.control, group_dst=rank)
                mine = full[start:stop]
            else:
                mine = np.empty((stop - start, *self.shapes[name][1:]), np.float32)
                if stop > start:
                    dist.recv(torch.from_numpy(mine), group=island.control, group_src=0)
            out[name] = self.device_of(name, mine)
        return out


class StreamedEncoding:
    """A contribution's Δ encoded tensor by tensor as rank 0 receives each whole (Layout.deltas), with its
    Courier's encoding and error feedback: the entries, norm and residual Courier.frame packs."""

    def __init__(self, courier, fragment: int, names: list[str]) -> None:
        self.encoding, self.feedback = courier.encoding, courier.wire.error_feedback
        self.residual = courier.residual.get(fragment)
        self.judged = set(courier.run.judged(dict.fromkeys(names)))
        self.encoded: dict = {}
        self.new_residual: dict | None = {} if self.feedback else None
        self.squares, self.error = 0.0, None

    def take(self, name: str, delta: np.ndarray) -> None:
        if name in self.judged:
            self.squares += l2_norm({name: delta}) ** 2
        if self.error is not None:
            return  # every tensor is still received (the other ranks send them all); the error is raised once
        residual = None if self.residual is None else {name: self.residual[name]}
        try:
            encoded, new = encode_fragment(
                {name: delta}, self.encoding, feedback=self.feedback, residual=residual
            )
        except PayloadError as error:
            self.error = error
            return
        self.encoded.update(encoded)
        if new is not None:
            self.new_residual.update(new)

    def norm(self) -> float:
        return math.sqrt(self.squares)

    def result(self) -> tuple[dict, dict | None]:
        if self.error is not None:
            raise self.error
        return self.encoded, self.new_residual


def _as_tensor(values) -> torch.Tensor:
    if isinstance(values, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(values))
    return values


def _read_only(array: np.ndarray) -> torch.Tensor:
    """A tensor viewing `array`, which may be read-only (a decoded commit's): it is only ever sent."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def host_float32(values) -> np.ndarray:
    """A C-contiguous float32 host array of `values` (viewed, not copied, where it already is one)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float32).numpy()
    return np.ascontiguousarray(values, dtype=np.float32)


class ShardedAdapter:
    """The torch adapter (frameworks/torch.py) of an FSDP2 model in an island: the run's schema (full
    shapes), but snapshots, clones and edits touch each rank's own shard only. While rank 0 joins the run
    (before training), its snapshots are of whole tensors gathered on its host one by one as they are taken:
    it may create the run, whose first commits are the model's values, or join one, whose commits it holds."""

    def __init__(self, adapter, island) -> None:
        self.island, self.inner = island, adapter
        self.schema, self.statistics = adapter.schema, adapter.statistics
        shapes = {name: shape for name, shape, _ in adapter.schema}
        self.names = list(shapes)
        rows = {name: _rows_of(name, t, island) for name, t in adapter.tensors.items() if _is_dtensor(t)}
        self.local = copy.copy(adapter)
        self.local.tensors = LocalShards(adapter.tensors)
        self.layout = Layout(
            island, rows, shapes, lambda name, v: self.local._on_device(name, v, dtype=torch.float32)
        )
        self.model, self.tensors = adapter.model, self.local.tensors
        self.joining = False  # rank 0, while it joins: its snapshots are of whole tensors, gathered on demand
        if frozen := [name for name, t in adapter.frozen_tensors.items() if _is_dtensor(t)]:
            raise ConfigError(
                f"frozen parameter {frozen[0]!r} is sharded by fully_shard: an island cannot check sharded "
                "frozen weights yet; leave frozen modules out of fully_shard, or use DDP inside the island"
            )

    def begin_join(self) -> None:
        """Rank 0, as the island enters: until joined(), a snapshot gathers each tensor whole on its host
        when it is taken (the other ranks serve its requests: collective/island.py, follow_join)."""
        self.joining = self.island.is_lead

    def joined(self) -> None:
        """Rank 0 has joined: from now on its edits and snapshots are of its shard, as on every rank."""
        self.joining = False

    def snapshot(self, names: list[str]) -> Arrays:
        if (
            self.joining
        ):  # one fragment (as the run's first commit or a check of one needs it), tensor by tensor
            return {name: self.gathered(name) for name in names}
        return self.local.snapshot(names)

    def gathered(self, name: str) -> np.ndarray:
        """Rank 0: tensor `name` whole on its host, its rows asked of the other ranks (send_rows)."""
        self.island.say([float(self.names.index(name))], 1)
        mine = self.local.snapshot([name])[name]
        return self.layout.whole(name, mine) if name in self.layout.rows else host_float32(mine).copy()

    def send(self, request: int) -> None:
        """Any other rank: its rows of the tensor rank 0 asked for (gathered)."""
        name = self.names[request]
        if name in self.layout.rows:
            self.layout.send_rows(name, self.local.snapshot([name])[name])

    def assign(self, values: Arrays) -> None:
        if self.joining:
            return  # the commits rank 0 joins at: every rank takes its part of them once it has joined
        self.local.assign(values)

    def on_device(self, values: Arrays) -> dict:
        """A commit as rank 0's Courier keeps it: sharded tensors stay on the host (each rank's rows go to its
        device when the commit is shared), replicated ones on the model's device."""
        return {
            name: host_float32(v)
            if name in self.layout.rows
            else self.local._on_device(name, v, dtype=torch.float32)
            for name, v in values.items()
        }

    def clone(self, names, into=None):
        return self.local.clone(names, into)

    def blend(self, values: Arrays, mixing: float) -> None:
        self.local.blend(values, mixing)

    def shift(self, change) -> None:
        self.local.shift(change)

    def frozen(self) -> list[list]:
        return self.inner.frozen()

    def local_state(self) -> Arrays:
        return self.inner.local_state()

    def load_local_state(self, values: Arrays) -> None:
        self.inner.load_local_state(values)


def _rows_of(name: str, tensor, island) -> list[tuple[int, int]]:
    """The rows each rank holds of an FSDP2 parameter, checked against the island: Shard(0) over a 1-D mesh of
    the island's ranks, in their order, each rank's local shard the rows torch.chunk gives it."""
    from torch.distributed.tensor import Shard

    mesh = tensor.device_mesh
    ranks = dist.get_process_group_ranks(island.group)
    if mesh.ndim != 1 or mesh.mesh.tolist() != ranks or tuple(tensor.placements) != (Shard(0),):
        raise ConfigError(
            f"tensor {name!r} is a DTensor placed {tuple(tensor.placements)} over the mesh {mesh.mesh.tolist()}: an "
            f"island shards a tensor by rows over its own ranks {ranks} only, as fully_shard(model) does on the "
            "island's group (HSDP and tensor parallelism are not supported); shard over the island's group"
        )
    rows = chunk_rows(tensor.shape[0], island.size)
    start, stop = rows[island.rank]
    local = tensor.to_local()
    if tuple(local.shape) != (stop - start, *tensor.shape[1:]):
        raise ConfigError(
            f"tensor {name!r}: this rank's shard has shape {tuple(local.shape)}, where rows {start}:{stop} of "
            f"{tuple(tensor.shape)} were expected (fully_shard's even chunks by rows)"
        )
    return rows


def island_adapter(island, adapter):
    """The adapter an island's rank trains through: the model's own, or its sharded view for FSDP2."""
    if any(_is_dtensor(t) for t in getattr(adapter, "tensors", {}).values()):
        return ShardedAdapter(adapter, island)
    return adapter
