"""sl.DeMo: DeMo as a torch.optim.Optimizer (research/algorithms.md §6). Each step compresses this node's
momentum (algorithms/demo.py), all-gathers every node's sparse coefficients through an exchange
(engine/exchange.py: one node, torch.distributed, ...), averages them and takes a sign step.
"""

from collections.abc import Iterable
from math import isfinite

import numpy as np
import torch
import torch.distributed as dist

from ..algorithms.demo import (
    SPARSE_AVERAGES,
    TRANSFORMS,
    VALUE_SCALES,
    VALUES,
    ChunkLayout,
    DeMoState,
    Group,
    Scratch,
    Sparse,
    demo_math,
    from_chunks,
    groups_of,
)
from ..engine.exchange import CoefficientExchange, SingleNode
from ..errors import ConfigError, PayloadError, SessionStateError
from ..wire.coefficients import decode_frame, encode_frame, frame_size
from ..wire.sparse import decode_sparse, encode_sparse, packed_size

# Each tensor's state: its rows of the momentum's coefficients, (chunks, h·w) in its group's basis (DeMoState).
MOMENTUM = "momentum_coefficients"


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
        # The frame holds one part per group of tensors with one chunk shape (algorithms/demo.groups_of).
        self._groups = groups_of(tuple((name, tuple(p.shape)) for name, p, _ in self._named()), chunk)
        # Each group's chunks per tensor and its segments, worked out once: a step asks for them many times.
        self._splits = [tuple(layout.chunks for layout in g.layouts) for g in self._groups]
        self._segments_of = [self._segments(g) for g in self._groups]
        self._max_bytes = frame_size([
            packed_size(g.chunks, self._k(g), g.chunk_numel, values, value_scale, self._segments(g))
            for g in self._groups
        ])  # fmt: skip
        self._step, self._sent, self._pending, self._own = 0, 0, None, (b"", [])
        self._held, self._views = None, {}  # the last step's momentum stacks and their views (_keep)
        self._views_key, self._views_made = (), []  # the sign step's views (_step_views)
        self._scratch = tuple(Scratch() for _ in self._groups)  # a step's temporaries, reused each step
        self.stats = {"steps": 0, "sent_bytes": 0, "received_bytes": 0, "missing": 0}
        self._math = demo_math(
            compression_decay=compression_decay, topk=topk, chunk=chunk, transform=transform,
            sparse_average_over=sparse_average, subtract=subtract, values=values, value_scale=value_scale,
            seed=seed,
        )  # fmt: skip

    def _k(self, group: Group) -> int:
        return min(self.topk, group.chunk_numel)

    def _segments(self, group: Group) -> tuple[int, ...] | None:
        """The chunks of each tensor of a group, where its values have a scale per tensor."""
        return tuple(layout.chunks for layout in group.layouts) if len(group.names) > 1 else None

    def _named(self) -> list[tuple[str, torch.Tensor, dict]]:
        return [
            (f"{g}.{i}", p, group)
            for g, group in enumerate(self.param_groups)
            for i, p in enumerate(group["params"])
        ]

    @torch.no_grad()
    def step(self, closure=None):
        """One DeMo step: begin_step (compress and pack), the exchange's all-gather, end_step (the sign step)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        payload = self.begin_step()
        self.end_step(self.exchange.all_gather(payload, step=self._step, max_bytes=self._max_bytes))
        return loss

    @torch.no_grad()
    def begin_step(self) -> bytes:
        """Compress this node's momentum; the step's payload, for every node (wire/coefficients.py). The
        simulator calls the two halves itself; step() calls them around its exchange."""
        named = self._named()
        # The step count lives in the optimizer's state (so load_state_dict resumes it), the same in each tensor.
        self._step = int(self.state[named[0][1]].get("step", 0)) if named else 0
        # A parameter without a gradient still sends its (zero-gradient) coefficients: every node's
        # payload keeps the same tensors, which the exchange needs.
        grads = {name: p.grad if p.grad is not None else torch.zeros_like(p) for name, p, _ in named}
        sent, self._pending = self._math.compress(
            grads, self._momentum(named), {name: group["lr"] for name, _, group in named}, self._scratch
        )
        parts = [
            encode_sparse(s.indices.cpu().numpy(), s.values.float().cpu().numpy(), group.chunk_numel,
                          values_as=self.values, scale=self.value_scale, segments=segments)
            for group, segments, s in zip(self._groups, self._segments_of, sent, strict=True)
        ]  # fmt: skip
        payload = encode_frame(self._step, parts)
        self._sent = len(payload)
        self._own = (payload, [(s.indices, s.values) for s in sent])  # what this payload decodes into
        return payload

    @torch.no_grad()
    def end_step(self, rows: list[bytes | None]) -> None:
        """Average the gathered payloads (None: a node that did not send in time) and take the sign step."""
        if self._pending is None:
            raise SessionStateError(
                "DeMo.end_step() without begin_step(): call step(), or both halves in order"
            )
        gathered = self._decode(rows)
        directions, state = self._math.direction(gathered, self._pending, self._scratch)
        self._pending = None
        self._keep(state)
        self._sign_step(state.groups, directions)
        self._step = state.step
        self.stats["steps"] += 1
        self.stats["sent_bytes"] += self._sent
        self.stats["received_bytes"] += sum(len(row) for row in rows if row is not None)  # its own included
        self.stats["missing"] += sum(row is None for row in rows)

    def _sign_step(self, groups: tuple[Group, ...], directions: list[torch.Tensor]) -> None:
        """p ← p·(1 − lr·wd) − lr·sign(u), each tensor from its chunks of its group's stack: one foreach call
        per learning rate and weight decay, not two calls a tensor (the same adds, in C++'s loop)."""
        options = {name: group for name, _, group in self._named()}
        decays: dict[float, list[torch.Tensor]] = {}
        steps: dict[float, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        for name, p, target, update, piece, layout in self._step_views(groups, directions):
            lr, weight_decay = options[name]["lr"], options[name]["weight_decay"]
            if weight_decay:
                decays.setdefault(1.0 - lr * weight_decay, []).append(p)
            targets, updates = steps.setdefault(-lr, ([], []))
            targets.append(target)
            updates.append(update if update is not None else from_chunks(piece, layout))
        for factor, tensors in decays.items():
            torch._foreach_mul_(tensors, factor)
        for alpha, (targets, updates) in steps.items():
            torch._foreach_add_(targets, updates, alpha=alpha)

    def _step_views(self, groups: tuple[Group, ...], directions: list[torch.Tensor]) -> list[tuple]:
        """(name, parameter, what to add to, what to add, its chunks, layout) per tensor: views of the
        parameter and of its chunks in the direction stacks, made again only when either moved (the stacks
        are the step's scratch, the same memory every step, so a step need not make some hundred views). A
        parameter that is not contiguous takes its update as a copy of its chunks each step (None here)."""
        named = self._named()
        # Memory and strides: a square parameter whose .data became its own transpose keeps its address
        key = tuple(d.data_ptr() for d in directions) + tuple((p.data_ptr(), p.stride()) for _, p, _ in named)
        if key != self._views_key:
            params = {name: p for name, p, _ in named}
            self._views_key, self._views_made = key, []
            for group, splits, signs in zip(groups, self._splits, directions, strict=True):
                for name, piece, layout in zip(group.names, signs.split(splits), group.layouts, strict=True):
                    p = params[name]
                    contiguous = p.is_contiguous()
                    target = _chunk_view(p, layout) if contiguous else p
                    update = _as_chunks(piece, layout) if contiguous else None
                    self._views_made.append((name, p, target, update, piece, layout))
        return self._views_made

    def _momentum(self, named: list[tuple[str, torch.Tensor, dict]]) -> DeMoState:
        """The momentum's coefficients as the math takes them: the stacks kept at the last step while each
        tensor's state still holds its view of them; else (a loaded state, the first step) stacked anew."""
        held = self._held
        if held is not None and all(
            self.state[p].get(MOMENTUM) is self._views.get(name) for name, p, _ in named
        ):
            return DeMoState(held.momentum, self._step, held.groups)
        params = {name: p for name, p, _ in named}
        stacks = []
        for group in self._groups:
            pieces = [self.state[params[name]].get(MOMENTUM) for name in group.names]
            stacks.append(torch.cat([
                piece.to(device=params[name].device, dtype=torch.float32) if piece is not None
                else params[name].new_zeros((layout.chunks, layout.chunk_numel), dtype=torch.float32)
                for name, piece, layout in zip(group.names, pieces, group.layouts, strict=True)
            ]))  # fmt: skip
        return DeMoState(tuple(stacks), self._step, self._groups)

    def _keep(self, state: DeMoState) -> None:
        """Each tensor's state holds its rows of its group's stack (a view: nothing is copied). The stacks
        are updated in place (the math's scratch), so the views of the last step still hold when they are
        the same stacks: then only the step count moves."""
        params = {name: p for name, p, _ in self._named()}
        held, self._held = self._held, state
        if held is not None and all(a is b for a, b in zip(held.momentum, state.momentum, strict=True)):
            for name in self._views:
                self.state[params[name]]["step"] = state.step
            return
        self._views = {}
        for group, splits, stack in zip(state.groups, self._splits, state.momentum, strict=True):
            for name, rows in zip(group.names, stack.split(splits), strict=True):
                self.state[params[name]][MOMENTUM], self.state[params[name]]["step"] = rows, state.step
                self._views[name] = rows

    def _decode(self, rows: list[bytes | None]) -> list[Sparse]:
        """Every node's coefficients per group, (nodes, chunks, k), less those missing or failing a check."""
        device = self._pending.momentum[0].device
        kept: list[list[tuple]] = []
        own, own_coefficients = self._own
        for node, row in enumerate(rows):
            if row is None:
                continue
            if row is own or row == own:  # this node's (or the same bytes): already at hand, and valid
                kept.append(own_coefficients)
                continue
            try:
                kept.append(self._decode_row(row))
            except PayloadError as error:
                tensor, reason = error.args if len(error.args) == 2 else ("-", str(error))
                self.refusals.append((node, tensor, reason))
        if not kept:  # an exchange's rows hold this node's own payload, which always decodes
            raise SessionStateError(f"DeMo step {self._step}: the exchange returned no node's payload, not even "
                                    "this node's own; an exchange must return every row, its own included")  # fmt: skip
        out = []
        for t in range(len(self._groups)):
            indices = torch.stack([torch.as_tensor(node[t][0], device=device) for node in kept])
            values = torch.stack([torch.as_tensor(node[t][1], device=device) for node in kept])
            out.append(Sparse(indices, values))
        return out

    def _decode_row(self, row: bytes) -> list[tuple[np.ndarray, np.ndarray]]:
        parts = decode_frame(row, step=self._step, tensors=len(self._groups))
        decoded = []
        for part, group, splits, segments in zip(
            parts, self._groups, self._splits, self._segments_of, strict=True
        ):
            try:
                decoded.append(decode_sparse(part, chunks=sum(splits), k=self._k(group),
                                             chunk_numel=group.chunk_numel, segments=segments))  # fmt: skip
            except PayloadError as error:
                raise PayloadError(_group_name(group), str(error)) from None
        return decoded


def _chunk_view(p: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """A contiguous tensor as (r, h, c, w): chunk (i, j) is [i, :, j, :], a view, nothing copied."""
    return p.view(layout.rows // layout.h, layout.h, layout.cols // layout.w, layout.w)


def _as_chunks(blocks: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """(chunks, h, w) blocks seen as _chunk_view's (r, h, c, w), strided: what adds to it in place."""
    r, c, h, w = layout.rows // layout.h, layout.cols // layout.w, layout.h, layout.w
    return blocks.view(r, c, h, w).permute(0, 2, 1, 3)


def _group_name(group: Group) -> str:
    """How a refusal names a group: its tensors' chunk shape and first tensor."""
    layout = group.layouts[0]
    more = f" and {len(group.names) - 1} more" if len(group.names) > 1 else ""
    return f"{layout.h}×{layout.w} chunks of {group.names[0]}{more}"
