"""Tensor encodings for the wire: how one float32 array becomes named arrays in a payload and back.

An encoding is a pair of pure functions: `encode(values)` returns the arrays to store (suffix -> array;
"" is the main entry, other suffixes start with "@", e.g. "@scale") and `decode(entries, shape)`
rebuilds float32. `ENCODINGS` maps each `delta_dtype` / `commit_dtype` name to its pair (the narrow
formats' rounding and bit arithmetic are in `minifloat.py`).

Formats (byte layouts and measured errors: docs/wire.md). Every entry is stored flat, little-endian.
- F32, F16: IEEE floats; F16 rounds to nearest even.
- BF16: the top half of each float32, rounded to nearest even, stored as U16 bits.
- F8_E4M3: blocks of 32 values (zero-padded), each with a power-of-two F32 scale in "@scale", the
  smallest that puts the block's largest magnitude at or under 448; values are E4M3FN codes (U8).
- F8_E4M3_TENSOR: the same codes with one power-of-two scale for the whole tensor.
- F4: OCP MX FP4 (E2M1 in blocks of 32, one E8M0 scale byte per block in "@scale", two codes per byte,
  low nibble first), scaled so that no value clips. Roundings: to nearest, ties to even; scales: powers of two.

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
    joined: bool = False  # a payload holds all tensors' bytes as one entry (a sparse tensor is smaller than its table line)


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
    blocks: np.ndarray, fmt: Minifloat, name: str
) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """Yield (rows, codes, k) for chunks of `blocks` (rows of 32 float32 values): each value's code
    (uint8, sign in the format's top bit, in a work array the next chunk overwrites) and each block's
    scale exponent k (scale 2**k), by `_exact_chunk`. Refuses (PayloadError naming encoding `name`)
    values that are not finite or reach SCALED_LIMIT."""
    scratch = Scratch()
    for rows in _chunks(len(blocks), CHUNK_BLOCKS):
        chunk = blocks[rows]
        codes = scratch("codes", np.uint8, chunk.shape)
        yield rows, codes, _exact_chunk(chunk, fmt, name, scratch, codes)


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
    chunk: np.ndarray, scratch: Scratch, codes: np.ndarray, most: np.ndarray, least: np.ndarray
) -> None:
    """Write into `codes` the E4M3 codes of the blocks of `chunk`, and into `most` and `least` each
    block's largest and smallest mu; the codes are right, as `_exact_chunk` gives them, in every block
    that `_left_over` does not pick, and placeholders in those (whatever their values, NaN included).

    mu, the exponent byte of bits(x) + 2**23 - 1 - E4M3.top_fraction, is the biased exponent of x, one
    more where its fraction exceeds that of 448: it is 127 + 8 plus the least k with |x| <= 448 * 2**k,
    so a block's largest mu gives its k. With the other test of `_left_over` (no value under E4M3's
    normal range at that scale, and k from -100 to 96), every value of a block is what `split_codes`
    needs.
    """
    flat = chunk.reshape(-1)
    # split_codes reuses this buffer: mu is all it is needed for
    biased = scratch("split_low", np.uint32, flat.shape)
    np.add(flat.view(np.uint32), 0x7FFFFF - E4M3.top_fraction, out=biased)
    mu = np.right_shift(biased, 23, out=scratch("mu", np.uint8, flat.shape), casting="unsafe")
    _block_reduce(mu, np.maximum, scratch, most)
    _block_reduce(mu, np.minimum, scratch, least)
    # (k + 126 + min_exponent) << 3 modulo 256, with k = most - 135: (most << 3) - 120
    offsets = np.left_shift(most, 3, out=scratch("offsets", np.uint8, most.shape))
    offsets += np.uint8(136)
    split_codes(flat, np.repeat(offsets, BLOCK), E4M3, scratch, codes.reshape(-1))


def _left_over(most: np.ndarray, least: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, indices of the blocks `_split_chunk` cannot serve), from each block's largest and smallest
    mu: those whose smallest mu is at most 127 + min_exponent + k (they may hold zeros or values under
    E4M3's normal range at their scale), or with k under -100 or over 96 (where split_codes would
    overflow; infinities and NaN, whose mu is 255 or, carried past it, at most 3, are among them)."""
    k = most.astype(np.int32)
    k -= 127 + E4M3.top_exponent
    left = least <= k + (127 + E4M3.min_exponent)
    left |= k < -100
    left |= k > 96
    return k, np.flatnonzero(left)


def _block_reduce(values: np.ndarray, pick: np.ufunc, scratch: Scratch, out: np.ndarray) -> None:
    """Write into `out` `pick` (np.maximum or np.minimum) of each 32 consecutive uint8 `values`, by picks between
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
    np.copyto(out, b.reshape(rows, 8)[:, 0])


def _e4m3_times(codes: np.ndarray, scales: np.ndarray, per_block: bool) -> np.ndarray:
    """Flat float32 of E4M3 `codes` times their scales: one a block of 32 (`per_block`), else one for
    all. NaN codes raise ValueError."""
    # 0xFF is the largest byte and 0x7F the largest int8: two reductions, no temporary
    if codes.max(initial=0) == 0xFF or codes.view(np.int8).max(initial=0) == 0x7F:
        raise ValueError("holds E4M3 NaN codes (0x7F or 0xFF)")
    # place_codes gives value * 2**-120; a scale from 2**7 on would overflow times 2**120, and then every
    # value takes 2**120 on its own first (exact), the scale after
    lift = float(np.abs(scales).max(initial=0.0)) >= 2.0**7
    factors = scales if lift else (scales.astype(np.float64) * 2.0**120).astype(np.float32)
    out, step = np.empty(codes.size, np.float32), CHUNK_BLOCKS * BLOCK
    for start in range(0, codes.size, step):
        values = out[start : start + step]
        place_codes(codes[start : start + step], E4M3, values)
        if lift:
            values *= np.float32(2.0**120)
        if per_block:  # repeated out to one factor per value: faster than broadcasting over rows of 32
            values *= np.repeat(factors[start // BLOCK : (start + step) // BLOCK], BLOCK)
        else:
            values *= factors[0]
    return out


def _encode_f8(values: np.ndarray) -> dict[str, np.ndarray]:
    """Every chunk through `_split_chunk`, then the blocks it leaves through `_exact_chunk`."""
    blocks = _as_blocks(_flat_f32(values))
    codes, scratch = np.empty(blocks.shape, np.uint8), Scratch()
    most, least = np.empty(len(blocks), np.uint8), np.empty(len(blocks), np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):  # in the placeholders of blocks left over
        for rows in _chunks(len(blocks), CHUNK_BLOCKS):
            _split_chunk(blocks[rows], scratch, codes[rows], most[rows], least[rows])
    k, left = _left_over(most, least)
    for part in _chunks(len(left), CHUNK_BLOCKS):
        rows = left[part]
        rest = blocks[rows]
        rest_codes = np.empty(rest.shape, np.uint8)
        try:
            k[rows] = _exact_chunk(rest, E4M3, "F8_E4M3", scratch, rest_codes)
        except PayloadError:
            _refuse_first_chunk(blocks, rows[~(np.abs(rest) < SCALED_LIMIT).all(axis=1)][0])
            raise
        codes[rows] = rest_codes
    return {"": codes.reshape(-1), "@scale": pow2(k)}


def _refuse_first_chunk(blocks: np.ndarray, bad_block: int) -> None:
    """Refuse as a chunk-by-chunk encoder would: name the largest magnitude of the first chunk that
    holds a value refused (the chunk of `bad_block`), and count that chunk's values that are not finite."""
    start = bad_block - bad_block % CHUNK_BLOCKS
    chunk = blocks[start : start + CHUNK_BLOCKS].reshape(-1)
    refuse(largest_magnitude(chunk), SCALED_LIMIT, "F8_E4M3", chunk)


def _decode_f8(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    blocks = _block_count(prod(shape))
    codes = _entry(entries, "", np.uint8, blocks * BLOCK)
    scales = _entry(entries, "@scale", np.float32, blocks)
    return _e4m3_times(codes, scales, per_block=True)[: prod(shape)].reshape(shape)


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
    codes = _entry(entries, "", np.uint8, prod(shape))
    scale = _entry(entries, "@scale", np.float32, 1)
    return _e4m3_times(codes, scale, per_block=False).reshape(shape)


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
    if name in ENCODINGS:
        return ENCODINGS[name]
    if isinstance(name, str) and name.startswith("TOPK("):  # sparse: its options are in its name (topk.py)
        from .topk import topk_encoding  # it builds on this module

        return topk_encoding(name)
    raise PayloadError(f"unknown encoding {name!r}; known encodings are {sorted(ENCODINGS)} and sl.TopK's")
