"""sl.DeMo: DeMo as a torch.optim.Optimizer (research/algorithms.md §6). Each step compresses this node's
momentum (algorithms/demo.py), all-gathers every node's sparse coefficients through an exchange
(engine/exchange.py: one node, torch.distributed, ...), averages them and takes a sign step.
"""

from collections.abc import Iterable
from math import isfinite

import torch
import torch.distributed as dist

from ..algorithms.demo import (
    SPARSE_AVERAGES,
    TRANSFORMS,
    VALUE_SCALES,
    VALUES,
    DeMoState,
    Sparse,
    demo_math,
    layout_of,
    refusal,
)
from ..engine.exchange import CoefficientExchange, SingleNode
from ..errors import ConfigError
from ..wire.sparse import packed_size


def _default_exchange() -> CoefficientExchange:
    if dist.is_available() and dist.is_initialized():
        from ..collective.gather import TorchDistributedExchange

        return TorchDistributedExchange()
    return SingleNode()


def _check_options(
    lr, compression_decay, topk, chunk, transform, sparse_average, values, value_scale, wd, subtract
):
    choices = {"transform": (transform, TRANSFORMS), "sparse_average": (sparse_average, SPARSE_AVERAGES),
               "values": (values, VALUES), "value_scale": (value_scale, VALUE_SCALES)}  # fmt: skip
    for name, (given, allowed) in choices.items():
        if given not in allowed:
            raise ConfigError(f"DeMo({name}={given!r}): choose one of {', '.join(map(repr, allowed))}")
    for name, given in {"topk": topk, "chunk": chunk}.items():
        if not isinstance(given, int) or isinstance(given, bool) or given < 1:
            raise ConfigError(
                f"DeMo({name}={given!r}): it must be a whole number ≥ 1 (defaults: topk=32, chunk=64)"
            )
    if not (isfinite(lr) and lr > 0):
        raise ConfigError(
            f"DeMo(lr={lr!r}): the learning rate must be a finite number > 0 (DeMo's default 4e-4)"
        )
    if not 0 <= compression_decay < 1:
        raise ConfigError(
            f"DeMo(compression_decay={compression_decay!r}): β must lie in [0, 1) (default 0.999)"
        )
    if not (isfinite(wd) and wd >= 0) or not (isfinite(subtract) and subtract >= 0):
        raise ConfigError(f"DeMo(weight_decay={wd!r}, subtract={subtract!r}): both must be finite and ≥ 0")


def _check_parameters(groups: list[dict]) -> None:
    devices = set()
    for g, group in enumerate(groups):
        for i, p in enumerate(group["params"]):
            where = f"parameter {i} of group {g} (shape {tuple(p.shape)}, {p.dtype})"
            if p.layout != torch.strided:
                raise ConfigError(f"DeMo cannot train {where}: it is sparse ({p.layout}); pass dense tensors")
            if not p.dtype.is_floating_point:
                raise ConfigError(
                    f"DeMo cannot train {where}: it is not floating point; leave it out of params"
                )
            devices.add(p.device)
    if len(devices) > 1:
        raise ConfigError(f"DeMo's parameters lie on {sorted(map(str, devices))}: keep them on one device")


class DeMo(torch.optim.Optimizer):
    """Decoupled momentum: m ← β·m + lr·g, send the top-k of each chunk's transform of m (and subtract it
    from m), then p ← p·(1 − lr·wd) − lr·sign(inverse transform of every node's averaged coefficients).
    β = compression_decay, k = topk, s = chunk (§6.1). `values` is how the coefficients travel ("f32" as
    the reference code, "bf16", "2bit", "sign"; the last two with a scale per tensor or per chunk). Nodes
    whose coefficients fail a check are left out of that step and counted in `refusals`."""

    def __init__(
        self,
        params: Iterable,
        lr: float,
        *,
        compression_decay: float = 0.999,
        topk: int = 32,
        chunk: int = 64,
        transform: str = "dct",
        weight_decay: float = 0.0,
        sparse_average: str = "contributors",
        subtract: float = 1.0,
        values: str = "bf16",
        value_scale: str = "tensor",
        seed: int = 0,
        exchange: CoefficientExchange | None = None,
    ) -> None:
        _check_options(lr, compression_decay, topk, chunk, transform, sparse_average, values, value_scale,
                       weight_decay, subtract)  # fmt: skip
        super().__init__(params, {"lr": float(lr), "weight_decay": float(weight_decay)})
        _check_parameters(self.param_groups)
        self.topk, self.chunk, self.values, self.value_scale = topk, chunk, values, value_scale
        self.exchange = exchange if exchange is not None else _default_exchange()
        self.refusals: list[tuple[int, str, str]] = []  # (node, tensor, reason), every step's
        self._shapes = {name: tuple(p.shape) for name, p, _ in self._named()}
        self.stats = {"steps": 0, "sent_bytes": 0, "received_bytes": 0, "packed_bytes": 0}
        self._math = demo_math(
            compression_decay=compression_decay, topk=topk, chunk=chunk, transform=transform,
            sparse_average_over=sparse_average, subtract=subtract, values=values, value_scale=value_scale,
            seed=seed,
        )  # fmt: skip

    def _named(self) -> list[tuple[str, torch.Tensor, dict]]:
        return [
            (f"{g}.{i}", p, group)
            for g, group in enumerate(self.param_groups)
            for i, p in enumerate(group["params"])
        ]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        named = self._named()
        # A parameter without a gradient still sends its (zero-gradient) coefficients: every node's
        # payload keeps the same size, which the all-gather needs.
        grads = {name: p.grad if p.grad is not None else torch.zeros_like(p) for name, p, _ in named}
        first = self.state[named[0][1]] if named else {}
        state = DeMoState(
            {
                name: self.state[p].get("momentum", torch.zeros_like(p, dtype=torch.float32))
                for name, p, _ in named
            },
            int(first.get("step", 0)),
        )
        sent, state = self._math.compress(grads, state, {name: group["lr"] for name, _, group in named})
        directions, state = self._math.direction(self._gather(sent), state)
        for name, p, group in named:
            self.state[p]["momentum"], self.state[p]["step"] = state.momentum[name], state.step
            if group["weight_decay"]:
                p.mul_(1.0 - group["lr"] * group["weight_decay"])
            p.add_(directions[name].sign().to(p.dtype), alpha=-group["lr"])
        self.stats["steps"] += 1
        return loss

    def _gather(self, sent: dict[str, Sparse]) -> dict[str, Sparse]:
        """Every node's coefficients per tensor, (nodes, chunks, k), less the nodes that failed a check."""
        layouts = {name: layout_of(tuple(self._shapes[name]), self.chunk) for name in sent}
        # The index type follows from the layouts alone, so every node picks the same one.
        index_type = (
            torch.int16
            if max((lay.chunk_numel for lay in layouts.values()), default=1) <= 2**15
            else torch.int32
        )
        value_type = torch.bfloat16 if self.values == "bf16" else torch.float32
        indices = torch.cat([s.indices.reshape(-1) for s in sent.values()]).to(index_type)
        values = torch.cat([s.values.reshape(-1) for s in sent.values()]).to(value_type)
        all_indices, all_values = self.exchange.all_gather(indices, values)
        nodes = all_indices.shape[0]
        self._count_bytes(sent, layouts, indices.nbytes + values.nbytes, nodes)
        gathered, offset, refused = {}, 0, set()
        for name, s in sent.items():
            size = s.indices.numel()
            rows = Sparse(all_indices[:, offset : offset + size].to(torch.int64).reshape(nodes, *s.indices.shape),
                          all_values[:, offset : offset + size].to(s.values.dtype).reshape(nodes, *s.values.shape))  # fmt: skip
            offset += size
            gathered[name] = rows
            for node in range(nodes):
                reason = refusal(Sparse(rows.indices[node], rows.values[node]), layouts[name], self.topk)
                if reason is not None:
                    refused.add(node)
                    self.refusals.append((node, name, reason))
        kept = torch.tensor([n for n in range(nodes) if n not in refused], dtype=torch.int64)
        return {name: Sparse(rows.indices[kept], rows.values[kept]) for name, rows in gathered.items()}

    def _count_bytes(self, sent: dict[str, Sparse], layouts: dict, exchanged: int, nodes: int) -> None:
        """sent/received: the bytes of this step's all-gather; packed: what wire/sparse.py would send."""
        self.stats["sent_bytes"] += exchanged
        self.stats["received_bytes"] += exchanged * nodes
        self.stats["packed_bytes"] += sum(
            packed_size(layouts[name].chunks, s.indices.shape[1], layouts[name].chunk_numel, self.values,
                        self.value_scale)
            for name, s in sent.items()
        )  # fmt: skip
