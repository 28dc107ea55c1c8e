"""DeMo's math (research/algorithms.md §6.1): a chunked orthonormal transform of each tensor, top-k per chunk,
error feedback, the sparse average of every node's coefficients, and the direction of the sign step.
Torch tensors on the parameters' device (the transform is two batched matrix products); no I/O, no state
beyond what DeMoState holds. The exchange between the two halves (compress, direction) is the caller's.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import NamedTuple

import numpy as np
import torch

from .scratch import Scratch, Scratches
from .top_k import top_k_indices

TRANSFORMS = ("dct", "identity", "random")
SPARSE_AVERAGES = ("contributors", "all")
VALUES = ("f32", "bf16", "2bit", "sign")
VALUE_SCALES = ("tensor", "chunk")
# The 2-bit levels, as multiples of the group's scale s = max|v|: uniform over [−s, s], no zero (top-k values
# are the largest of their chunk). float32 constants, so numpy and torch give the same products.
TWO_BIT_LEVELS = (-1.0, -1.0 / 3.0, 1.0 / 3.0, 1.0)


class ChunkLayout(NamedTuple):
    """A tensor seen as a (rows, cols) matrix cut into h×w chunks. 0-d and 1-d tensors are one row (h = 1);
    a tensor of 3 or more dimensions keeps its first and flattens the rest (a conv weight: out × in·kh·kw)."""

    shape: tuple[int, ...]
    rows: int
    cols: int
    h: int
    w: int

    @property
    def chunks(self) -> int:
        return (self.rows // self.h) * (self.cols // self.w)

    @property
    def chunk_numel(self) -> int:
        return self.h * self.w


def largest_divisor_at_most(n: int, limit: int) -> int:
    """The chunk length of a dimension of n: its largest divisor ≤ limit (n itself when n ≤ limit)."""
    return next(d for d in range(min(n, limit), 0, -1) if n % d == 0)


@lru_cache(maxsize=1024)
def layout_of(shape: tuple[int, ...], chunk: int) -> ChunkLayout:
    rows = shape[0] if len(shape) >= 2 else 1
    cols = math.prod(shape[1:]) if len(shape) >= 2 else math.prod(shape)
    return ChunkLayout(
        tuple(shape), rows, cols, largest_divisor_at_most(rows, chunk), largest_divisor_at_most(cols, chunk)
    )


def to_chunks(x: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """(chunks, h, w): chunk (i, j) of the matrix is row i·(cols/w) + j."""
    r, c, h, w = layout.rows // layout.h, layout.cols // layout.w, layout.h, layout.w
    return x.reshape(r, h, c, w).permute(0, 2, 1, 3).reshape(-1, h, w)


def from_chunks(blocks: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    r, c, h, w = layout.rows // layout.h, layout.cols // layout.w, layout.h, layout.w
    return blocks.reshape(r, c, h, w).permute(0, 2, 1, 3).reshape(layout.shape)


@lru_cache(maxsize=64)
def dct_matrix(n: int) -> torch.Tensor:
    """Orthonormal DCT-II, float64 on the CPU: C[k, j] = √(2/n)·c_k·cos(π(2j+1)k / 2n), c_0 = 1/√2."""
    k, j = torch.arange(n, dtype=torch.float64)[:, None], torch.arange(n, dtype=torch.float64)[None, :]
    matrix = math.sqrt(2.0 / n) * torch.cos(math.pi * (2 * j + 1) * k / (2 * n))
    matrix[0] /= math.sqrt(2.0)
    return matrix


def random_orthonormal(n: int, seed: int, step: int, axis: int) -> torch.Tensor:
    """A Haar-random orthonormal n×n matrix, float64 on the CPU, the same on every node for (seed, step)."""
    state = np.random.SeedSequence([seed, step, n, axis]).generate_state(2, np.uint64)
    generator = torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))
    q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))  # the sign fix that makes QR's Q Haar-distributed


class Basis(NamedTuple):
    """The separable transform of one layout: Y = rows · X · colsᵀ for each h×w chunk X."""

    rows: torch.Tensor
    cols: torch.Tensor


@lru_cache(maxsize=256)
def _fixed_matrix(transform: str, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The DCT or identity matrix in the parameters' dtype, on their device: made once, not every step."""
    matrix = dct_matrix(n) if transform == "dct" else torch.eye(n, dtype=torch.float64)
    return matrix.to(dtype=dtype, device=device)


def basis_of(layout: ChunkLayout, transform: str, *, seed: int, step: int, like: torch.Tensor) -> Basis:
    def one(n: int, axis: int) -> torch.Tensor:
        if transform == "random":
            return random_orthonormal(n, seed, step, axis).to(dtype=like.dtype, device=like.device)
        return _fixed_matrix(transform, n, like.dtype, like.device)

    return Basis(one(layout.h, 0), one(layout.w, 1))


def forward(x: torch.Tensor, layout: ChunkLayout, basis: Basis) -> torch.Tensor:
    """(chunks, h·w) coefficients of x: every chunk at once, as two batched matrix products."""
    return forward_blocks(to_chunks(x, layout), basis)


def inverse(coefficients: torch.Tensor, layout: ChunkLayout, basis: Basis) -> torch.Tensor:
    """The tensor whose forward() is `coefficients` (the bases are orthonormal: the inverse is the transpose)."""
    return from_chunks(inverse_blocks(coefficients, basis), layout)


def forward_blocks(blocks: torch.Tensor, basis: Basis, scratch: Scratch | None = None) -> torch.Tensor:
    """(chunks, h·w) coefficients of (chunks, h, w) blocks, of one tensor or many; into scratch if given."""
    if scratch is None:
        return (basis.rows @ blocks @ basis.cols.T).reshape(blocks.shape[0], -1)
    product = torch.matmul(basis.rows, blocks, out=scratch.buffer("product", blocks.shape, blocks))
    out = scratch.buffer("coefficients", blocks.shape, blocks)
    return torch.matmul(product, basis.cols.T, out=out).view(blocks.shape[0], -1)


def inverse_blocks(coefficients: torch.Tensor, basis: Basis, scratch: Scratch | None = None) -> torch.Tensor:
    h, w = basis.rows.shape[0], basis.cols.shape[0]
    blocks = coefficients.reshape(-1, h, w)
    if scratch is None:
        return basis.rows.T @ blocks @ basis.cols
    product = torch.matmul(basis.rows.T, blocks, out=scratch.buffer("product", blocks.shape, blocks))
    return torch.matmul(product, basis.cols, out=scratch.buffer("inverse", blocks.shape, blocks))


class Sparse(NamedTuple):
    """Coefficients kept per chunk: chunk-local indices in [0, h·w) and their values, both (…, chunks, k)."""

    indices: torch.Tensor
    values: torch.Tensor


def top_k(coefficients: torch.Tensor, k: int, scratch: Scratch | None = None) -> Sparse:
    """The k largest |coefficients| of each chunk (all of them when the chunk holds k or fewer)."""
    magnitudes = None if scratch is None else scratch.buffer("magnitudes", coefficients.shape, coefficients)
    picked = top_k_indices(torch.abs(coefficients, out=magnitudes), min(k, coefficients.shape[1]))
    return Sparse(picked, coefficients.gather(1, picked))


def scatter(sparse: Sparse, chunk_numel: int) -> torch.Tensor:
    """Dense (chunks, h·w) coefficients, zero where nothing was kept."""
    dense = sparse.values.new_zeros(sparse.values.shape[0], chunk_numel)
    return dense.scatter_(1, sparse.indices, sparse.values)


def sparse_average(
    gathered: Sparse, chunk_numel: int, how: str, scratch: Scratch | None = None
) -> torch.Tensor:
    """Every node's coefficients (indices and values (M, chunks, k)) averaged into dense (chunks, h·w):
    over the nodes that picked each coefficient ("contributors", the code's rule) or over all M ("all")."""
    nodes, chunks, k = gathered.values.shape
    indices = gathered.indices.permute(1, 0, 2).reshape(chunks, nodes * k)
    values = gathered.values.permute(1, 0, 2).reshape(chunks, nodes * k)
    scratch = scratch if scratch is not None else Scratch()
    total = scratch.buffer("average", (chunks, chunk_numel), values).zero_()
    total.scatter_add_(1, indices, values)
    if how == "all":
        return total.div_(max(nodes, 1))
    # Counts in bytes where they fit (a quarter of the memory to clear and add into); exact small integers
    # either way, so the quotients are the same
    tally = torch.uint8 if nodes < 256 else torch.int32
    counts = scratch.buffer("counts", (chunks, chunk_numel), indices, tally).zero_()
    counts.scatter_add_(1, indices, torch.ones(indices.shape, dtype=tally, device=indices.device))
    # total / counts where anything was picked (elsewhere 0 already), without a pass over every coefficient
    return total.scatter_(1, indices, total.gather(1, indices) / counts.gather(1, indices).to(values.dtype))


def _group_reduce(
    magnitudes: torch.Tensor, scale: str, reduce: str, owners: torch.Tensor | None
) -> torch.Tensor:
    """(chunks, 1) scales, or one: per chunk, per tensor (owners[c]: the tensor of chunk c, when the chunks
    are of several tensors) or over all."""
    if scale == "chunk":
        reduced = magnitudes.amax(1, keepdim=True) if reduce == "max" else magnitudes.mean(1, keepdim=True)
    elif owners is None:
        reduced = magnitudes.amax() if reduce == "max" else magnitudes.mean()
    else:
        tensors = int(owners[-1]) + 1
        per_chunk = magnitudes.amax(1) if reduce == "max" else magnitudes.sum(1)
        how = "amax" if reduce == "max" else "sum"
        reduced = per_chunk.new_zeros(tensors).scatter_reduce_(0, owners, per_chunk, how, include_self=False)
        if reduce == "mean":
            reduced = reduced / (torch.bincount(owners, minlength=tensors) * magnitudes.shape[1])
        reduced = reduced[owners].unsqueeze(1)
    return reduced.to(torch.bfloat16).to(magnitudes.dtype)  # a bf16 scale: 2 bytes on the wire


def quantize(
    values: torch.Tensor, how: str, scale: str = "tensor", owners: torch.Tensor | None = None
) -> torch.Tensor:
    """The values as the wire carries them (wire/sparse.py packs exactly these): "f32" as they are, "bf16"
    rounded to nearest even, "2bit" on TWO_BIT_LEVELS·s with s = max|v|, "sign" as ±s with s = mean|v|
    (s per tensor or per chunk, itself rounded to bf16; `owners`, the tensor of each chunk, when the
    (chunks, k) values are of several tensors)."""
    if how == "f32":
        return values
    if how == "bf16":
        return values.to(torch.bfloat16).to(values.dtype)
    if how == "sign":
        s = _group_reduce(values.abs(), scale, "mean", owners)
        return torch.where(values >= 0, s, -s)
    s = _group_reduce(values.abs(), scale, "max", owners)
    codes = torch.round((values / torch.where(s > 0, s, 1.0) + 1.0) * 1.5).clamp(0, 3).long()
    return _two_bit_levels(values.dtype, values.device)[codes] * s


@lru_cache(maxsize=16)
def _two_bit_levels(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """TWO_BIT_LEVELS as a tensor, made once (a tensor from a tuple each step costs as much as the look-up)."""
    return torch.tensor(TWO_BIT_LEVELS, dtype=dtype, device=device)


class Group(NamedTuple):
    """The tensors whose chunks have one shape (h, w), in the parameters' order: transformed, picked and
    averaged together, as one stack of chunks (what makes a step a few large products, not many small)."""

    names: tuple[str, ...]
    layouts: tuple[ChunkLayout, ...]

    @property
    def chunk_numel(self) -> int:
        return self.layouts[0].chunk_numel

    @property
    def chunks(self) -> int:
        return sum(layout.chunks for layout in self.layouts)

    @property
    def owners(self) -> list[int]:
        """The tensor (its place in the group) of each chunk of the stack."""
        return [t for t, layout in enumerate(self.layouts) for _ in range(layout.chunks)]


@lru_cache(maxsize=64)
def groups_of(shapes: tuple[tuple[str, tuple[int, ...]], ...], chunk: int) -> tuple[Group, ...]:
    """The groups of (name, shape) pairs, in the order each chunk shape first appears."""
    by_shape: dict[tuple[int, int], list[tuple[str, ChunkLayout]]] = {}
    for name, shape in shapes:
        layout = layout_of(tuple(shape), chunk)
        by_shape.setdefault((layout.h, layout.w), []).append((name, layout))
    return tuple(
        Group(tuple(n for n, _ in members), tuple(lay for _, lay in members)) for members in by_shape.values()
    )


def stack_chunks(
    tensors: dict[str, torch.Tensor], group: Group, scratch: Scratch | None = None
) -> torch.Tensor:
    """(chunks, h, w) float32: the group's tensors' chunks, one tensor after another, each copied once into
    place (and into float32 on the way: the transform of a bf16 gradient in bf16 would lose its digits)."""
    like = tensors[group.names[0]]
    h, w = group.layouts[0].h, group.layouts[0].w
    scratch = scratch if scratch is not None else Scratch()
    blocks = scratch.buffer("stack", (group.chunks, h, w), like, torch.float32)
    if h == 1 and all(tensors[name].dtype == torch.float32 for name in group.names):
        # Rows of one: a tensor's chunks are its runs of w values, the stack the tensors end to end (one cat)
        torch.cat([tensors[name].reshape(-1) for name in group.names], out=blocks.view(-1))
        return blocks
    at = 0
    for name, layout in zip(group.names, group.layouts, strict=True):
        r, c = layout.rows // h, layout.cols // w
        place = blocks[at : at + layout.chunks].view(r, c, h, w)
        place.copy_(tensors[name].reshape(r, h, c, w).permute(0, 2, 1, 3))
        at += layout.chunks
    return blocks


@lru_cache(maxsize=64)
def owners_of(group: Group, device: torch.device) -> torch.Tensor | None:
    """The tensor (its place in the group) of each chunk of the stack, on `device`; None for one tensor."""
    return torch.tensor(group.owners, device=device) if len(group.names) > 1 else None


@dataclass(frozen=True)
class DeMoState:
    """The momentum as its coefficients: one (chunks, h·w) float32 stack per group (groups_of the tensors),
    in the basis of the last step compressed (every step's for the DCT and the identity); the steps done.
    The transform is orthonormal and linear, so m ← β·m + lr·g and m ← m − what was sent hold in its
    coordinates as in the tensors': only the averaged update needs the inverse transform."""

    momentum: tuple[torch.Tensor, ...]
    step: int
    groups: tuple[Group, ...]


class DeMoMath(NamedTuple):
    init: Callable[[dict[str, torch.Tensor]], DeMoState]
    compress: Callable[..., tuple[list[Sparse], DeMoState]]
    direction: Callable[..., tuple[list[torch.Tensor], DeMoState]]


def groups_of_tensors(tensors: dict[str, torch.Tensor], chunk: int) -> tuple[Group, ...]:
    return groups_of(tuple((name, tuple(t.shape)) for name, t in tensors.items()), chunk)


def _lr_of(group: Group, lr: dict[str, float], like: torch.Tensor) -> float | torch.Tensor:
    """The group's learning rate: one number, or (chunks, 1), each chunk its tensor's, where they differ."""
    rates = [float(lr[name]) for name in group.names]
    if len(set(rates)) == 1:
        return rates[0]
    per_chunk = [
        rate for rate, layout in zip(rates, group.layouts, strict=True) for _ in range(layout.chunks)
    ]
    return torch.tensor(per_chunk, dtype=like.dtype, device=like.device).unsqueeze(1)


def into_basis_of_step(
    momentum: torch.Tensor, group: Group, transform: str, seed: int, step: int
) -> torch.Tensor:
    """The momentum's coefficients moved from the basis of step − 1 into step's (random transforms):
    T_t·T_{t−1}⁻¹ per axis, two products; the DCT and the identity are the same every step."""
    if transform != "random" or step == 0:
        return momentum
    now = basis_of(group.layouts[0], transform, seed=seed, step=step, like=momentum)
    before = basis_of(group.layouts[0], transform, seed=seed, step=step - 1, like=momentum)
    change = Basis(now.rows @ before.rows.T, now.cols @ before.cols.T)
    h, w = group.layouts[0].h, group.layouts[0].w
    return forward_blocks(momentum.reshape(-1, h, w), change)


def _zero_state(params: dict[str, torch.Tensor], *, chunk: int) -> DeMoState:
    groups = groups_of_tensors(params, chunk)
    like = next(iter(params.values()))
    zeros = tuple(like.new_zeros((g.chunks, g.chunk_numel), dtype=torch.float32) for g in groups)
    return DeMoState(zeros, 0, groups)


def demo_math(
    *,
    compression_decay: float,
    topk: int,
    chunk: int,
    transform: str = "dct",
    sparse_average_over: str = "contributors",
    subtract: float = 1.0,
    values: str = "f32",
    value_scale: str = "tensor",
    seed: int = 0,
) -> DeMoMath:
    """One DeMo step in two halves around the exchange (§6.1, β = compression_decay, k = topk, s = chunk):
        compress:  m ← β·m + lr·g ;  (idx, v) = quantize(topk_k(T_t(m))) ;  m ← m − subtract·T_t⁻¹(idx, v)
        direction: u = T_t⁻¹(average over nodes of (idx, v)) ;  sign(u): the caller steps p ← p − lr·sign(u)
    T_t is the chunked DCT-II, the identity, or a random orthonormal transform drawn for step t. The state
    keeps T_t(m), so compress is one forward transform (of g) and direction one inverse. Both halves work on
    groups_of(the tensors): what compress sends is one Sparse per group, (chunks, k) each."""
    beta, factor = float(compression_decay), float(subtract)

    def basis(group: Group, step: int, like: torch.Tensor) -> Basis:
        return basis_of(group.layouts[0], transform, seed=seed, step=step, like=like)

    def compress(
        grads: dict[str, torch.Tensor], state: DeMoState, lr: dict[str, float], scratch: Scratches = None
    ) -> tuple[list[Sparse], DeMoState]:
        """With `scratch` the momentum is updated in its own memory (the state passed in is spent)."""
        sent, after = [], []
        for i, (group, momentum) in enumerate(zip(state.groups, state.momentum, strict=True)):
            work = scratch[i] if scratch is not None else Scratch()
            blocks = stack_chunks(grads, group, work)
            coefficients = forward_blocks(blocks, basis(group, state.step, blocks), work)  # T_t(g)
            moved = into_basis_of_step(momentum, group, transform, seed, state.step)
            target = momentum if scratch is not None else torch.empty_like(momentum)
            coefficients.mul_(_lr_of(group, lr, blocks))
            coefficients = torch.add(coefficients, moved, alpha=beta, out=target)
            picked = top_k(coefficients, topk, work)
            owners = owners_of(group, blocks.device)
            picked = Sparse(picked.indices, quantize(picked.values, values, value_scale, owners))
            if factor:
                coefficients.scatter_add_(1, picked.indices, picked.values * -factor)
            sent.append(picked)
            after.append(coefficients)
        return sent, DeMoState(tuple(after), state.step, state.groups)

    def direction(
        gathered: list[Sparse], state: DeMoState, scratch: Scratches = None
    ) -> tuple[list[torch.Tensor], DeMoState]:
        """sign(u), a (chunks, h, w) stack per group (from_chunks gives each tensor's), from every node's
        coefficients ((M, chunks, k) a group); the step is then complete. With `scratch`, they live in it."""
        out = []
        for i, (group, sparse) in enumerate(zip(state.groups, gathered, strict=True)):
            work = scratch[i] if scratch is not None else Scratch()
            averaged = sparse_average(sparse, group.chunk_numel, sparse_average_over, work)
            out.append(inverse_blocks(averaged, basis(group, state.step, averaged), work).sign_())
        return out, DeMoState(state.momentum, state.step + 1, state.groups)

    return DeMoMath(partial(_zero_state, chunk=chunk), compress, direction)
