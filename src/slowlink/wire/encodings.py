"""Tensor encodings for the wire: how one float32 array becomes named arrays in a payload and back.

An encoding is a pair of pure functions: `encode(values)` returns the arrays to store (suffix -> array;
"" is the main entry, other suffixes start with "@", e.g. "@scale") and `decode(entries, shape)`
rebuilds float32. `ENCODINGS` maps each `delta_dtype` / `commit_dtype` name to its pair. The rounding
and bit arithmetic of the narrow formats is in `minifloat.py`; here are the formats and their blocks.

Formats (byte layouts and measured errors: docs/wire.md). Every entry is stored flat, little-endian.
- F32, F16: IEEE floats; F16 rounds to nearest even.
- BF16: the top half of each float32, rounded to nearest even, stored as U16 bits.
- F8_E4M3: blocks of 32 values (zero-padded), each with a power-of-two F32 scale in "@scale", the
  smallest that puts the block's largest magnitude at or under 448; values are E4M3FN codes (U8).
- F8_E4M3_TENSOR: the same codes with one power-of-two scale for the whole tensor.
- F4: OCP MX FP4 (E2M1 in blocks of 32, one E8M0 scale byte per block in "@scale", two codes per byte,
  low nibble first). The scale is the smallest that does not clip, so no value saturates.
All roundings are to nearest, ties to even, and scales are powers of two, so decoding is exact.

Edge values: zeros keep their sign; float32 denormals pass through F32 and BF16 and elsewhere keep
what the format (after its scale) can express. Encoders refuse NaN, infinities and magnitudes a format
cannot hold (F16 from 65520, BF16 near float32's largest, scaled formats from 2**127) with PayloadError.
Decoders refuse malformed entries and E4M3 NaN codes (ValueError); an F4 scale byte of 255 decodes to
NaN, which `payload.unpack` rejects like any value that is not finite.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from math import prod

import numpy as np

from ..errors import PayloadError
from .minifloat import (
    E2M1,
    E4M3,
    FP16,
    Minifloat,
    Scratch,
    place_codes,
    pow2,
    round_codes,
    scale_exponents,
    split_codes,
)

BLOCK = 32  # values per scale in F8_E4M3 and F4, as in OCP MX
CHUNK_BLOCKS = 8192  # blocks per pass: 1 MiB of float32, so the temporaries of a pass stay in cache


@dataclass(frozen=True)
class Encoding:
    """A format's pair of functions; `encode`'s arrays may share memory with its input (F32 does)."""

    name: str
    encode: Callable[[np.ndarray], dict[str, np.ndarray]]
    decode: Callable[[dict[str, np.ndarray], tuple[int, ...]], np.ndarray]


F16_LIMIT = 65520.0  # the first magnitude that rounds to infinity in F16
BF16_LIMIT = float(np.array(0x7F7F8000, np.uint32).view(np.float32))  # likewise in BF16
SCALED_LIMIT = 2.0**127  # rounding may carry a block's largest magnitude to the next power of two


# ---- shared pieces ---------------------------------------------------------------------------------


def _flat_f32(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32).reshape(-1)


def _chunks(size: int, step: int) -> Iterator[slice]:
    return (slice(start, start + step) for start in range(0, size, step))


def largest_magnitude(flat: np.ndarray) -> float:
    """max |value| of a flat numpy array or torch tensor, NaN if any value is NaN; min and max are each faster
    than one pass of abs."""
    return max(-float(flat.min()), float(flat.max())) if flat.shape[0] else 0.0


def refuse(largest: float, limit: float, name: str, values: np.ndarray) -> None:
    """Raise PayloadError unless `largest` (a magnitude) is under `limit`; NaN never is. `values`, a numpy
    array or a torch tensor, are counted only to say why."""
    if largest < limit:
        return
    nonfinite = int(((values != values) | (abs(values) == np.inf)).sum())  # NaN, ±inf; operators serve both
    if nonfinite:
        raise PayloadError(
            f"{nonfinite} values are NaN or infinite; payloads never carry them (did training diverge?)"
        )
    raise PayloadError(
        f"values reach magnitude {largest:.6g}, which {name} cannot hold (limit {limit:.6g}); "
        "use a wider encoding such as BF16 or F32"
    )


def _entry(entries: dict[str, np.ndarray], suffix: str, dtype: type, size: int) -> np.ndarray:
    """The stored array `suffix`, checked to be flat `dtype` with `size` elements (ValueError if not)."""
    stored = entries[suffix]
    if stored.dtype != dtype or stored.ndim != 1 or stored.size != size:
        raise ValueError(
            f"entry {suffix or 'main'!r} is {stored.dtype}{list(stored.shape)}, "
            f"expected {np.dtype(dtype)}[{size}]"
        )
    return stored


def _block_count(size: int) -> int:
    return -(-size // BLOCK)


def _as_blocks(flat: np.ndarray) -> np.ndarray:
    """`flat` as rows of BLOCK values, zero-padded at the end (a view when nothing needs padding)."""
    if flat.size % BLOCK == 0:
        return flat.reshape(-1, BLOCK)
    blocks = np.zeros((_block_count(flat.size), BLOCK), flat.dtype)
    blocks.reshape(-1)[: flat.size] = flat
    return blocks


def _unpad(blocks: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return blocks.reshape(-1)[: prod(shape)].reshape(shape)


# ---- F32, F16, BF16 --------------------------------------------------------------------------------


def _encode_f32(values: np.ndarray) -> dict[str, np.ndarray]:
    flat = _flat_f32(values)
    refuse(largest_magnitude(flat), np.inf, "F32", flat)
    return {"": flat}


def _decode_f32(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    return _entry(entries, "", np.float32, prod(shape)).reshape(shape)


def _encode_f16(values: np.ndarray) -> dict[str, np.ndarray]:
    # Our own rounding: numpy's float16 cast is several times slower.
    flat, scratch = _flat_f32(values), Scratch()
    out = np.empty(flat.size, np.uint16)
    for part in _chunks(flat.size, CHUNK_BLOCKS * BLOCK):
        refuse(largest_magnitude(flat[part]), F16_LIMIT, "F16", flat[part])
        magnitude = np.abs(flat[part], out=scratch("magnitude", np.float32, flat[part].shape))
        round_codes(magnitude, flat[part], FP16, scratch, out[part])
    return {"": out.view(np.float16)}


def _decode_f16(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    stored = _entry(entries, "", np.float16, prod(shape)).view(np.uint16)
    out = np.empty(stored.size, np.float32)
    for part in _chunks(stored.size, CHUNK_BLOCKS * BLOCK):
        place_codes(stored[part], FP16, out[part])
        out[part] *= np.float32(2.0**112)
    return out.reshape(shape)


def _encode_bf16(values: np.ndarray) -> dict[str, np.ndarray]:
    flat, scratch = _flat_f32(values), Scratch()
    bits, out = flat.view(np.uint32), np.empty(flat.size, np.uint16)
    for part in _chunks(flat.size, CHUNK_BLOCKS * BLOCK):
        refuse(largest_magnitude(flat[part]), BF16_LIMIT, "BF16", flat[part])
        # Round half to even: add 0x7FFF plus the lowest kept bit, then keep the high half.
        rounded = np.right_shift(bits[part], 16, out=scratch("rounded", np.uint32, bits[part].shape))
        rounded &= 1
        rounded += bits[part]
        rounded += 0x7FFF
        out[part] = rounded.view(np.uint16)[1::2]
    return {"": out}


def _decode_bf16(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    stored = _entry(entries, "", np.uint16, prod(shape))
    out = np.empty(stored.size, np.uint32)
    for part in _chunks(stored.size, CHUNK_BLOCKS * BLOCK):
        out[part] = stored[part]
        out[part] <<= 16
    return out.view(np.float32).reshape(shape)


# ---- block-scaled minifloats: F8_E4M3, F8_E4M3_TENSOR and F4 ---------------------------------------


def quantize_blocks(
    blocks: np.ndarray, fmt: Minifloat, name: str, codes: np.ndarray | None = None
) -> Iterator[tuple[slice | np.ndarray, np.ndarray, np.ndarray]]:
    """Yield (rows, codes, k) for chunks of `blocks` (rows of 32 float32 values): each value's code
    (uint8, sign in the format's top bit) and each block's scale exponent k (scale 2**k).

    `codes` is written in place when given, else a work array overwritten by the next chunk. Refuses
    (PayloadError naming encoding `name`) values that are not finite or reach SCALED_LIMIT. Chunks take
    `_split_chunk` where it serves them, else `_exact_chunk`; the blocks `_split_chunk` leaves come
    last, all at once, with `rows` an array of their indices. Every block gets what `_exact_chunk`
    gives it.
    """
    scratch, left = Scratch(), []
    for rows in _chunks(len(blocks), CHUNK_BLOCKS):
        chunk = blocks[rows]
        chunk_codes = scratch("codes", np.uint8, chunk.shape) if codes is None else codes[rows]
        # E2M1 is normal only from 1 to 6 times its scale: nearly every block holds a value under that
        split = _split_chunk(chunk, fmt, scratch, chunk_codes) if fmt.exponent_bits > 2 else None
        if split is None:
            yield rows, chunk_codes, _exact_chunk(chunk, fmt, name, scratch, chunk_codes)
        else:
            left.append(split[1] + rows.start)
            yield rows, chunk_codes, split[0]
    rows = np.concatenate(left) if left else np.empty(0, np.intp)
    if len(rows):
        rest = blocks[rows]
        rest_codes = np.empty(rest.shape, np.uint8)
        yield rows, rest_codes, _exact_chunk(rest, fmt, name, scratch, rest_codes)


def _exact_chunk(
    chunk: np.ndarray, fmt: Minifloat, name: str, scratch: Scratch, codes: np.ndarray
) -> np.ndarray:
    """Write the codes of any blocks of `chunk` into `codes` and return their scale exponents: each
    block's largest magnitude gives k, values times 2**-k (exact) go to `round_codes`."""
    magnitude = scratch("magnitude", np.int32, chunk.shape)
    np.bitwise_and(chunk.view(np.int32), 0x7FFFFFFF, out=magnitude)
    # Each block's largest magnitude, compared as integers (faster than floats; NaN is largest).
    absmax = np.maximum.reduceat(magnitude.reshape(-1), np.arange(0, chunk.size, BLOCK)).view(np.float32)
    refuse(float(absmax.max()), SCALED_LIMIT, name, chunk)
    k = scale_exponents(absmax, fmt)
    scaled = magnitude.view(np.float32)
    scaled *= pow2(-k)[:, None]
    round_codes(scaled, chunk, fmt, scratch, codes)
    return k


def _split_chunk(
    chunk: np.ndarray, fmt: Minifloat, scratch: Scratch, codes: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """Codes and scale exponents as `_exact_chunk` gives them, in fewer passes, except for the blocks
    whose indices come second (theirs are placeholders); None for a chunk this cannot serve: with a
    scale above 2**96 (infinities and NaN included), or more than one block in eight left over.

    mu, the exponent byte of bits(x) + 2**23 - 1 - fmt.top_fraction, is the biased exponent of x, one
    more where its fraction exceeds that of fmt.max_value: it is 127 + fmt.top_exponent plus the least
    k with |x| <= max_value * 2**k, so a block's largest mu gives its k. A block is left over when its
    smallest mu is at most 127 + min_exponent + k (it may hold zeros or values under the format's
    normal range at its scale) or when k < -100; all values of the other blocks are what
    `split_codes` needs, normal at their scale and far from float32's limits.
    """
    flat = chunk.reshape(-1)
    # split_codes reuses this buffer: mu is all it is needed for
    biased = scratch("split_low", np.uint32, flat.shape)
    np.add(flat.view(np.uint32), 0x7FFFFF - fmt.top_fraction, out=biased)
    mu = np.right_shift(biased, 23, out=scratch("mu", np.uint8, flat.shape), casting="unsafe")
    k = _block_reduce(mu, np.maximum, scratch).astype(np.int32)
    k -= 127 + fmt.top_exponent  # under -127 only in blocks left over, whose k comes later
    if k.max() > 96:  # split_codes would overflow; infinities and most NaN (mu 255) end here too
        return None
    small = _block_reduce(mu, np.minimum, scratch) <= k + (127 + fmt.min_exponent)
    left = np.flatnonzero(small | (k < -100))
    # A NaN whose bits carry mu past 255 (to at most 3) is in a block left over: refuse it with its chunk
    if len(left) > len(chunk) // 8 or not np.isfinite(chunk[left]).all():
        return None
    offsets = ((k + 126 + fmt.min_exponent) << fmt.mantissa_bits).astype(np.uint8)  # modulo 256
    split_codes(flat, np.repeat(offsets, BLOCK), fmt, scratch, codes.reshape(-1))
    return k, left


def _block_reduce(values: np.ndarray, pick: np.ufunc, scratch: Scratch) -> np.ndarray:
    """`pick` (np.maximum or np.minimum) of each 32 consecutive uint8 `values`, by picks between
    shifted views that halve the live bytes of every block (16 apart, then 8, 4, 2, 1): a few byte
    passes, where np.maximum.reduceat costs one call per block. Outputs never overlap inputs, which
    would make numpy copy them first."""
    n, rows = values.size, values.size // BLOCK
    first, second = scratch("reduce_a", np.uint8, (n,)), scratch("reduce_b", np.uint8, (n,))
    pick(values[:-16], values[16:], out=first[:-16])
    pick(first[:-24], first[8:-16], out=second[:-24])  # bytes 0-7 of each block hold what matters
    eights = scratch("reduce_8", np.uint64, (2, rows))
    np.copyto(eights[0], second.view(np.uint64).reshape(rows, BLOCK // 8)[:, 0])
    a, b = eights[0].view(np.uint8), eights[1].view(np.uint8)
    pick(a[:-4], a[4:], out=b[:-4])
    pick(b[:-6], b[2:-4], out=a[:-6])
    pick(a[:-7], a[1:-6], out=b[:-7])
    return b.reshape(rows, 8)[:, 0]


def _e4m3_times(codes: np.ndarray, factors: np.ndarray, out: np.ndarray) -> None:
    """Write E4M3 `codes` (rows of 32) times their factors (one per row, or a scalar for all) into `out`;
    NaN codes raise ValueError."""
    # 0xFF is the largest byte and 0x7F the largest int8: two reductions, no temporary
    if codes.max(initial=0) == 0xFF or codes.view(np.int8).max(initial=0) == 0x7F:
        raise ValueError("holds E4M3 NaN codes (0x7F or 0xFF)")
    place_codes(codes, E4M3, out)  # value * 2**-120
    factors = np.asarray(factors, np.float64) * 2.0**120
    if factors.max(initial=0.0) >= 2.0**127:
        out *= np.float32(2.0**120)  # a scale above 2**7: apply 2**120 on its own to stay finite
        factors *= 2.0**-120
    if factors.ndim == 0:
        out *= np.float32(factors)
    else:  # repeated out to one factor per value: faster than broadcasting over rows of 32
        out *= np.repeat(factors.astype(np.float32), BLOCK).reshape(out.shape)


def _encode_f8(values: np.ndarray) -> dict[str, np.ndarray]:
    blocks = _as_blocks(_flat_f32(values))
    codes, scales = np.empty(blocks.shape, np.uint8), np.empty(len(blocks), np.float32)
    for rows, chunk_codes, k in quantize_blocks(blocks, E4M3, "F8_E4M3", codes):
        codes[rows], scales[rows] = chunk_codes, pow2(k)  # the first is a no-op where they are one
    return {"": codes.reshape(-1), "@scale": scales}


def _decode_f8(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    blocks = _block_count(prod(shape))
    codes = _entry(entries, "", np.uint8, blocks * BLOCK).reshape(blocks, BLOCK)
    scales = _entry(entries, "@scale", np.float32, blocks)
    out = np.empty((blocks, BLOCK), np.float32)
    for rows in _chunks(blocks, CHUNK_BLOCKS):
        _e4m3_times(codes[rows], scales[rows], out[rows])
    return _unpad(out, shape)


def _encode_f8_tensor(values: np.ndarray) -> dict[str, np.ndarray]:
    flat, scratch = _flat_f32(values), Scratch()
    absmax = largest_magnitude(flat)
    refuse(absmax, SCALED_LIMIT, "F8_E4M3_TENSOR", flat)
    exponent = scale_exponents(np.array([absmax], np.float32), E4M3)
    inverse = pow2(-exponent)[0]
    codes = np.empty(flat.size, np.uint8)
    for part in _chunks(flat.size, CHUNK_BLOCKS * BLOCK):
        scaled = np.abs(flat[part], out=scratch("magnitude", np.float32, flat[part].shape))
        scaled *= inverse
        round_codes(scaled, flat[part], E4M3, scratch, codes[part])
    return {"": codes, "@scale": pow2(exponent)}


def _decode_f8_tensor(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    codes = _as_blocks(_entry(entries, "", np.uint8, prod(shape)))
    scale = _entry(entries, "@scale", np.float32, 1)
    out = np.empty(codes.shape, np.float32)
    for rows in _chunks(len(codes), CHUNK_BLOCKS):
        _e4m3_times(codes[rows], scale[0], out[rows])
    return _unpad(out, shape)


def _encode_f4(values: np.ndarray) -> dict[str, np.ndarray]:
    blocks = _as_blocks(_flat_f32(values))
    packed, scales = np.empty((len(blocks), BLOCK // 2), np.uint8), np.empty(len(blocks), np.uint8)
    for rows, codes, k in quantize_blocks(blocks, E2M1, "F4"):
        # Two codes per byte, the earlier value in the low nibble: read as little-endian uint16 pairs,
        # (pair >> 4) | pair has the later code in bits 4-7 over the earlier one in bits 0-3.
        pairs = codes.view(np.uint16)
        packed[rows] = (pairs >> 4) | pairs  # keeps the low byte
        scales[rows] = k + 127  # E8M0
    return {"": packed.reshape(-1), "@scale": scales}


# Each byte decodes to two float32 values (low nibble first), looked up as one 8-byte word.
_F4_PAIRS = np.stack(np.meshgrid(E2M1.values(), E2M1.values(), indexing="xy"), axis=-1)
_F4_PAIRS = np.ascontiguousarray(_F4_PAIRS.reshape(256, 2)).view(np.float64).reshape(256)
# E8M0: 2**(byte - 127); byte 0 is 2**-127 (a float32 denormal), 255 is NaN.
_E8M0 = np.append(np.ldexp(np.float32(1), np.arange(-127, 128, dtype=np.int32)), np.float32(np.nan))


def _decode_f4(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    blocks = _block_count(prod(shape))
    packed = _entry(entries, "", np.uint8, blocks * BLOCK // 2).reshape(blocks, BLOCK // 2)
    scales = _E8M0[_entry(entries, "@scale", np.uint8, blocks)]
    out = np.empty((blocks, BLOCK), np.float32)
    for rows in _chunks(blocks, CHUNK_BLOCKS):
        values = out[rows]
        np.take(_F4_PAIRS, packed[rows], out=values.view(np.float64), mode="clip")
        values *= scales[rows, None]
    return _unpad(out, shape)


ENCODINGS: dict[str, Encoding] = {
    "F32": Encoding("F32", _encode_f32, _decode_f32),
    "F16": Encoding("F16", _encode_f16, _decode_f16),
    "BF16": Encoding("BF16", _encode_bf16, _decode_bf16),
    "F8_E4M3": Encoding("F8_E4M3", _encode_f8, _decode_f8),
    "F8_E4M3_TENSOR": Encoding("F8_E4M3_TENSOR", _encode_f8_tensor, _decode_f8_tensor),
    "F4": Encoding("F4", _encode_f4, _decode_f4),
}


def get_encoding(name: str) -> Encoding:
    try:
        return ENCODINGS[name]
    except KeyError:
        raise PayloadError(f"unknown encoding {name!r}; known encodings are {sorted(ENCODINGS)}") from None
