"""The packed wire format of one tensor's sparse coefficients (DeMo, top-k compressors): chunk-local indices,
sorted in each chunk, in as few bits as the chunk needs (12 for 4096 values) or Rice-coded by their gaps
(wire/rice.py) when that is shorter; values as f32, bf16, 2 bits or a sign, each with a bf16 scale per tensor
or per chunk. Lossless: it packs values already quantized (algorithms/demo.quantize).

    header  version (u8), format (u8: values | scale << 2 | indices << 3); the layout (chunks, k, chunk_numel)
            is the reader's, from the tensor's shape, and any other count fails the length checks
    indices packed: chunks·k indices, `index_bits` each, big-endian bit order, padded to a byte
            rice: wire/rice.py's parameter, unary quotients and remainders
    scales  (2bit, sign) one bf16 per tensor or per chunk (a part holding the chunks of several tensors, as
            DeMo's of one chunk shape, has one per tensor: `segments`, each tensor's chunks, the reader's)
    values  f32: 4 bytes · bf16: 2 bytes · 2bit: codes of TWO_BIT_LEVELS · sign: the sign bit
"""

import struct

import numpy as np

from ..errors import PayloadError
from . import rice
from .bits import pack_uints, unpack_uints

VERSION = 4
HEADER = struct.Struct("<BB")
VALUE_FORMATS = ("f32", "bf16", "2bit", "sign")
SCALES = ("tensor", "chunk")
INDEX_CODINGS = ("packed", "rice")
TWO_BIT_LEVELS = np.array([-1.0, -1.0 / 3.0, 1.0 / 3.0, 1.0], np.float32)  # as algorithms/demo.py's


def index_bits(chunk_numel: int) -> int:
    """Bits per chunk-local index: enough for chunk_numel − 1 (12 for a 64×64 chunk), at least one."""
    return max(1, (chunk_numel - 1).bit_length())


Segments = tuple[int, ...] | None  # the chunks of each tensor in a part, in order; None: one tensor


def _scale_count(chunks: int, values: str, scale: str, segments: Segments) -> int:
    if values in ("f32", "bf16"):
        return 0
    return chunks if scale == "chunk" else (len(segments) if segments else 1)


def _values_size(chunks: int, k: int, values: str, scale: str, segments: Segments = None) -> int:
    count = chunks * k
    value_bytes = {"f32": 4 * count, "bf16": 2 * count, "2bit": -(-2 * count // 8), "sign": -(-count // 8)}
    return 2 * _scale_count(chunks, values, scale, segments) + value_bytes[values]


def packed_size(
    chunks: int, k: int, chunk_numel: int, values: str, scale: str = "tensor", segments: Segments = None
) -> int:
    """Bytes of encode_sparse's output with packed indices, fixed by the layout: the most it ever writes
    (Rice-coded indices are chosen only when shorter)."""
    index_bytes = -(-chunks * k * index_bits(chunk_numel) // 8)
    return HEADER.size + index_bytes + _values_size(chunks, k, values, scale, segments)


def _bf16_bits(values: np.ndarray, what: str) -> np.ndarray:
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    if np.any(bits & 0xFFFF):
        raise PayloadError(
            f"{what} are not bf16 numbers: round them to bf16 first (algorithms.demo.quantize)"
        )
    return (bits >> 16).astype("<u2")


def _from_bf16_bits(stored: np.ndarray) -> np.ndarray:
    return (stored.astype(np.uint32) << 16).view(np.float32)


def check_coefficients(indices: np.ndarray, values: np.ndarray, chunk_numel: int) -> None:
    """Refuse coefficients no node could have sent: an index outside its chunk, one twice, a NaN. The indices
    of each chunk are sorted (as encode_sparse sorts them and every coding keeps them), so a repeat is a
    zero step and one out of order a negative step."""
    if indices.shape != values.shape or indices.ndim != 2:
        raise PayloadError(f"indices {indices.shape} and values {values.shape} must both be (chunks, k)")
    if indices.size and (indices.min() < 0 or indices.max() >= chunk_numel):
        raise PayloadError(f"an index outside [0, {chunk_numel}), the chunk's coefficients")
    steps = np.diff(indices, axis=1)
    if steps.size and steps.min() <= 0:
        if np.any(steps == 0):
            raise PayloadError("an index twice in one chunk: a chunk's coefficients are distinct")
        raise PayloadError("indices out of order in a chunk: a coder writes each chunk's sorted")
    if not np.isfinite(values).all():
        raise PayloadError("a NaN or infinite value among the coefficients")


def _group_scales(values: np.ndarray, scale: str, segments: Segments) -> np.ndarray:
    """(groups, 1) scales, the largest magnitude of each chunk, tensor or segment."""
    magnitudes = np.abs(values)
    if scale == "chunk":
        return magnitudes.max(axis=1, keepdims=True)
    if not segments:
        return magnitudes.max().reshape(1, 1)
    starts = np.cumsum((0, *segments[:-1]))
    return np.maximum.reduceat(magnitudes.max(axis=1), starts).reshape(-1, 1)


def _each_chunks(s: np.ndarray, scale: str, segments: Segments) -> np.ndarray:
    """Scales of groups as (chunks, 1), or (1, 1): what multiplies each chunk's values."""
    return np.repeat(s, segments, axis=0) if scale == "tensor" and segments else s


def _check_segments(chunks: int, segments: Segments) -> None:
    if segments is not None and (sum(segments) != chunks or min(segments, default=1) < 1):
        raise ValueError(f"segments {segments} must be positive and add up to the {chunks} chunks")


def _encode_values(values: np.ndarray, how: str, scale: str, segments: Segments) -> bytes:
    if how == "f32":
        return np.ascontiguousarray(values, "<f4").tobytes()
    if how == "bf16":
        return _bf16_bits(values, "the values").tobytes()
    scales = _group_scales(values, scale, segments)
    s = _each_chunks(scales, scale, segments)
    if how == "sign":
        if np.any(np.abs(values) != s):
            raise PayloadError("sign values must be ±s, one s per group: quantize them first")
        return _bf16_bits(scales, "the scales").tobytes() + np.packbits(np.signbit(values).ravel()).tobytes()
    safe = np.where(s > 0, s, np.float32(1))
    codes = np.clip(np.rint((values / safe + 1) * 1.5), 0, 3).astype(np.uint8)
    codes = np.where(s > 0, codes, np.where(np.signbit(values), 1, 2)).astype(np.uint8)
    if np.any(TWO_BIT_LEVELS[codes] * s != values):
        raise PayloadError(
            "2bit values must lie on TWO_BIT_LEVELS·max|v| of their group: quantize them first"
        )
    return _bf16_bits(scales, "the scales").tobytes() + pack_uints(codes.ravel(), 2)


def _sorted_by_index(indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each chunk's indices in increasing order, each value beside its index (through flat positions: numpy's
    take_along_axis is several times slower at these sizes)."""
    chunks, k = indices.shape
    order = (np.argsort(indices, axis=1) + np.arange(0, chunks * k, k)[:, None]).ravel()
    return indices.ravel()[order].reshape(chunks, k), values.ravel()[order].reshape(chunks, k)


def encode_sparse(
    indices: np.ndarray,
    values: np.ndarray,
    chunk_numel: int,
    *,
    values_as: str = "bf16",
    scale: str = "tensor",
    index_coding: str = "shortest",
    segments: Segments = None,
) -> bytes:
    """Pack (chunks, k) chunk-local indices and their values, already quantized as `values_as`, each chunk's
    sorted by index. index_coding: "packed", "rice", or "shortest" (whichever makes fewer bytes).
    segments: the chunks of each tensor, when the part holds several (one scale each)."""
    if (
        values_as not in VALUE_FORMATS
        or scale not in SCALES
        or index_coding not in (*INDEX_CODINGS, "shortest")
    ):
        raise PayloadError(f"values_as={values_as!r}, scale={scale!r}, index_coding={index_coding!r}: choose "
                           f"from {VALUE_FORMATS}, {SCALES}, {(*INDEX_CODINGS, 'shortest')}")  # fmt: skip
    indices, values = np.asarray(indices), np.asarray(values, np.float32)
    if indices.shape != values.shape or indices.ndim != 2:
        raise PayloadError(f"indices {indices.shape} and values {values.shape} must both be (chunks, k)")
    indices, values = _sorted_by_index(indices, values)
    check_coefficients(indices, values, chunk_numel)
    chunks, k = indices.shape
    _check_segments(chunks, segments)
    bits = index_bits(chunk_numel)
    b, coded_bits = rice.best_parameter(rice.gaps_of(indices), bits)
    if index_coding == "shortest":
        shorter = rice.rice_size(chunks * k, b, coded_bits) < -(-chunks * k * bits // 8)
        index_coding = "rice" if shorter else "packed"
    coded = rice.encode_rice(indices, b) if index_coding == "rice" else pack_uints(indices.ravel(), bits)
    form = VALUE_FORMATS.index(values_as) | SCALES.index(scale) << 2 | INDEX_CODINGS.index(index_coding) << 3
    header = HEADER.pack(VERSION, form)
    return header + coded + _encode_values(values, values_as, scale, segments)


def _read_header(data: bytes) -> tuple[str, str, str]:
    if len(data) < HEADER.size:
        raise PayloadError(
            f"{len(data)} bytes: shorter than the {HEADER.size}-byte header of sparse coefficients"
        )
    version, form = HEADER.unpack_from(data)
    if version != VERSION or form >> 4:
        raise PayloadError(f"not sparse coefficients of format {VERSION} (version {version}, format {form})")
    return VALUE_FORMATS[form & 3], SCALES[form >> 2 & 1], INDEX_CODINGS[form >> 3 & 1]


def _decode_values(body: bytes, chunks: int, k: int, how: str, scale: str, segments: Segments) -> np.ndarray:
    count, groups = chunks * k, _scale_count(chunks, how, scale, segments)
    if how == "f32":
        return np.frombuffer(body, "<f4").astype(np.float32).reshape(chunks, k)
    if how == "bf16":
        return _from_bf16_bits(np.frombuffer(body, "<u2")).reshape(chunks, k)
    scales = _from_bf16_bits(np.frombuffer(body[: 2 * groups], "<u2")).reshape(groups, 1)
    s = _each_chunks(scales, scale, segments)
    rest = body[2 * groups :]
    if how == "sign":
        negative = np.unpackbits(np.frombuffer(rest, np.uint8), count=count).reshape(chunks, k).astype(bool)
        return np.where(negative, -s, s).astype(np.float32)
    return TWO_BIT_LEVELS[unpack_uints(rest, count, 2).reshape(chunks, k)] * s


def decode_sparse(
    data: bytes, *, chunks: int, k: int, chunk_numel: int, segments: Segments = None
) -> tuple[np.ndarray, np.ndarray]:
    """(indices int64, values float32), both (chunks, k), from a peer's bytes; a PayloadError says why not."""
    _check_segments(chunks, segments)
    how, scale, coding = _read_header(data)
    bits, count = index_bits(chunk_numel), chunks * k
    if coding == "packed":
        index_end = HEADER.size + -(-count * bits // 8)
        if len(data) >= index_end:
            indices = unpack_uints(data[HEADER.size : index_end], count, bits).reshape(chunks, k)
    else:
        indices, used = rice.decode_rice(data[HEADER.size :], chunks, k, bits)
        index_end = HEADER.size + used
    expected = index_end + _values_size(chunks, k, how, scale, segments)
    if len(data) != expected:
        raise PayloadError(f"{len(data)} bytes where {chunks} chunks of {k} coefficients out of {chunk_numel} "
                           f"pack into {expected}: truncated, padded, or the wrong count for this tensor")  # fmt: skip
    values = _decode_values(data[index_end:], chunks, k, how, scale, segments)
    check_coefficients(indices, values, chunk_numel)
    return indices, values
