"""sl.TopK: a sparse delta_dtype for the DiLoCo family, SparseLoCo-style. Each tensor, seen as a matrix cut
into chunk×chunk blocks (as DeMo's, research/algorithms.md §6.1), keeps the `fraction` of each block with the
largest magnitudes, its values in 2 bits, signs, bf16 or f32, packed by wire/sparse.py (Rice-coded indices).
What a round leaves out is not lost: the method turns on error feedback (wire/error_feedback.py), so it goes
into the node's next contribution. The encoding's name carries its options: payloads name it, joiners compare.
"""

import math
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import ConfigError, PayloadError
from .encodings import Encoding
from .sparse import SCALES, TWO_BIT_LEVELS, VALUE_FORMATS, decode_sparse, encode_sparse

NAME = re.compile(r"TOPK\(fraction=([0-9.e+-]+),chunk=([0-9]+),values=([a-z0-9]+),scale=([a-z]+)\)")


@dataclass(frozen=True)
class TopK:
    """delta_dtype=sl.TopK(fraction=1/64, chunk=64, values="2bit"): the top `fraction` of each chunk×chunk
    block by magnitude (at least one value a block), values as "2bit" (a scale per tensor or per chunk, the
    default SparseLoCo's), "sign", "bf16" or "f32"."""

    fraction: float = 1 / 64
    chunk: int = 64
    values: str = "2bit"
    scale: str = "tensor"

    def __post_init__(self) -> None:
        if (
            not isinstance(self.fraction, int | float)
            or isinstance(self.fraction, bool)
            or not 0 < self.fraction <= 1
        ):
            raise ConfigError(
                f"TopK(fraction={self.fraction!r}): the share of each chunk sent, in (0, 1], e.g. 1/64"
            )
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or not 1 <= self.chunk <= 4096:
            raise ConfigError(
                f"TopK(chunk={self.chunk!r}): a chunk's side, a whole number in [1, 4096] (64 usual)"
            )
        if self.values not in VALUE_FORMATS or self.scale not in SCALES:
            raise ConfigError(f"TopK(values={self.values!r}, scale={self.scale!r}): choose values from "
                              f"{VALUE_FORMATS} and scale from {SCALES}")  # fmt: skip
        object.__setattr__(self, "fraction", float(self.fraction))

    @property
    def name(self) -> str:
        return f"TOPK(fraction={self.fraction!r},chunk={self.chunk},values={self.values},scale={self.scale})"


def parse_topk(name: str) -> TopK:
    """The TopK a canonical name stands for; PayloadError for any other string."""
    found = NAME.fullmatch(name)
    try:
        topk = TopK(float(found[1]), int(found[2]), found[3], found[4]) if found else None
    except (ConfigError, ValueError):
        topk = None
    if topk is None or topk.name != name:
        raise PayloadError(f"{name!r} is not a TopK encoding's name, such as {TopK().name!r}")
    return topk


def _side(n: int, limit: int) -> int:
    return next(d for d in range(min(n, limit), 0, -1) if n % d == 0)  # the largest divisor of n ≤ limit


def _chunks_of(shape: tuple[int, ...], chunk: int) -> tuple[int, int, int, int]:
    """(rows, cols, h, w) as DeMo's layout: the first dimension by the rest, cut into h×w chunks."""
    rows = shape[0] if len(shape) >= 2 else 1
    cols = math.prod(shape[1:]) if len(shape) >= 2 else math.prod(shape)
    return rows, cols, _side(rows, chunk), _side(cols, chunk)


def _to_bf16(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def quantize(values: np.ndarray, how: str, scale: str) -> np.ndarray:
    """As algorithms/demo.quantize, in numpy: what wire/sparse.py packs exactly."""
    if how == "f32":
        return values
    if how == "bf16":
        return _to_bf16(values)
    magnitudes = np.abs(values)
    reduce = np.mean if how == "sign" else np.max
    s = reduce(magnitudes, axis=1, keepdims=True) if scale == "chunk" else reduce(magnitudes).reshape(1, 1)
    s = _to_bf16(s.astype(np.float32))
    if how == "sign":
        return np.where(values >= 0, s, -s).astype(np.float32)
    codes = np.clip(np.rint((values / np.where(s > 0, s, 1) + 1) * 1.5), 0, 3).astype(np.int64)
    return (TWO_BIT_LEVELS[codes] * s).astype(np.float32)


def _blocks(x: np.ndarray, layout: tuple[int, int, int, int]) -> np.ndarray:
    rows, cols, h, w = layout
    return x.reshape(rows // h, h, cols // w, w).transpose(0, 2, 1, 3).reshape(-1, h * w)


def _unblock(blocks: np.ndarray, layout: tuple[int, int, int, int], shape: tuple[int, ...]) -> np.ndarray:
    rows, cols, h, w = layout
    return blocks.reshape(rows // h, cols // w, h, w).transpose(0, 2, 1, 3).reshape(shape)


@lru_cache(maxsize=16)
def topk_encoding(name: str) -> Encoding:
    topk = parse_topk(name)

    def kept(numel: int) -> int:
        return min(numel, max(1, round(topk.fraction * numel)))

    def encode(values: np.ndarray) -> dict[str, np.ndarray]:
        x = np.ascontiguousarray(values, np.float32)
        if x.size == 0:
            return {"": np.zeros(0, np.uint8)}
        if not np.isfinite(x).all():
            raise PayloadError(
                "values are NaN or infinite; payloads never carry them (did training diverge?)"
            )
        layout = _chunks_of(x.shape, topk.chunk)
        blocks = _blocks(x, layout)
        k = kept(blocks.shape[1])
        picked = np.argpartition(-np.abs(blocks), k - 1, axis=1)[:, :k]
        sent = quantize(np.take_along_axis(blocks, picked, 1), topk.values, topk.scale)
        data = encode_sparse(picked, sent, blocks.shape[1], values_as=topk.values, scale=topk.scale)
        return {"": np.frombuffer(data, np.uint8)}

    def decode(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
        stored = entries[""]
        if stored.dtype != np.uint8 or stored.ndim != 1:
            raise ValueError(
                f"entry 'main' is {stored.dtype}{list(stored.shape)}, expected packed uint8 bytes"
            )
        if math.prod(shape) == 0:
            return np.zeros(shape, np.float32)
        layout = _chunks_of(tuple(shape), topk.chunk)
        chunks, numel = (layout[0] // layout[2]) * (layout[1] // layout[3]), layout[2] * layout[3]
        try:
            indices, values = decode_sparse(stored.tobytes(), chunks=chunks, k=kept(numel), chunk_numel=numel)
        except PayloadError as error:
            raise ValueError(str(error)) from None
        blocks = np.zeros((chunks, numel), np.float32)
        np.put_along_axis(blocks, indices, values, 1)
        return _unblock(blocks, layout, tuple(shape))

    return Encoding(name, encode, decode, joined=True)
