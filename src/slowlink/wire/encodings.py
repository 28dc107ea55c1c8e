"""Tensor encodings for the wire: how one float32 array becomes named arrays in a payload and back.

An encoding is a pair of pure functions: `encode(values)` returns the arrays to store (suffix -> array;
"" is the main entry, other suffixes start with "@", e.g. "@scale") and `decode(entries, shape)`
rebuilds float32. `ENCODINGS` maps each `delta_dtype` / `commit_dtype` name to its pair.

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

BLOCK = 32  # values per scale in F8_E4M3 and F4, as in OCP MX
CHUNK_BLOCKS = 8192  # blocks per pass: 1 MiB of float32, so the temporaries of a pass stay in cache


@dataclass(frozen=True)
class Encoding:
    """A format's pair of functions; `encode`'s arrays may share memory with its input (F32 does)."""

    name: str
    encode: Callable[[np.ndarray], dict[str, np.ndarray]]
    decode: Callable[[dict[str, np.ndarray], tuple[int, ...]], np.ndarray]


@dataclass(frozen=True)
class Minifloat:
    """A float format narrower than float32: a sign bit, `exponent_bits`, `mantissa_bits`."""

    exponent_bits: int
    mantissa_bits: int
    min_exponent: int  # exponent of the smallest normal value; below it values are subnormal
    max_value: float

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    def values(self) -> np.ndarray:
        """The float32 value of every code, by code (E4M3FN's NaN codes show as ±480)."""
        m = self.mantissa_bits
        codes = np.arange(1 << (self.bits - 1))
        field, fraction = codes >> m, codes & ((1 << m) - 1)
        magnitude = np.where(
            field == 0,
            np.ldexp(fraction.astype(np.float64), self.min_exponent - m),
            np.ldexp(1.0 + fraction / (1 << m), field - 1 + self.min_exponent),
        )
        return np.concatenate([magnitude, -magnitude]).astype(np.float32)


E4M3 = Minifloat(exponent_bits=4, mantissa_bits=3, min_exponent=-6, max_value=448.0)
E2M1 = Minifloat(exponent_bits=2, mantissa_bits=1, min_exponent=0, max_value=6.0)
FP16 = Minifloat(exponent_bits=5, mantissa_bits=10, min_exponent=-14, max_value=65504.0)

F16_LIMIT = 65520.0  # the first magnitude that rounds to infinity in F16
BF16_LIMIT = float(np.array(0x7F7F8000, np.uint32).view(np.float32))  # likewise in BF16
SCALED_LIMIT = 2.0**127  # rounding may carry a block's largest magnitude to the next power of two


# ---- shared pieces ---------------------------------------------------------------------------------


def _flat_f32(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32).reshape(-1)


def _chunks(size: int, step: int) -> Iterator[slice]:
    return (slice(start, start + step) for start in range(0, size, step))


def _largest_magnitude(flat: np.ndarray) -> float:
    """max |value|, NaN if any value is NaN; min and max are each faster than one pass of np.abs."""
    return max(-float(flat.min()), float(flat.max())) if flat.size else 0.0


def _refuse(largest: float, limit: float, name: str, values: np.ndarray) -> None:
    """Raise PayloadError unless `largest` (a magnitude) is under `limit`; NaN never is."""
    if largest < limit:
        return
    nonfinite = int(np.count_nonzero(~np.isfinite(values)))
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


def _pow2(exponents: np.ndarray) -> np.ndarray:
    return np.ldexp(np.float32(1), exponents.astype(np.int32))


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


# ---- minifloat codes -------------------------------------------------------------------------------


class Scratch:
    """Work arrays reused from chunk to chunk: a fresh 1 MiB array per step costs page faults."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}
        self._constants: dict[tuple[int, str], np.ndarray] = {}

    def __call__(self, name: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        size = prod(shape) * np.dtype(dtype).itemsize
        if name not in self._buffers or self._buffers[name].size < size:
            self._buffers[name] = np.empty(size, np.uint8)
        return self._buffers[name][:size].view(dtype).reshape(shape)

    def full(self, value: int, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        """An array of `value`: numpy's maximum against one is several times faster than against a scalar."""
        key, size = (value, np.dtype(dtype).str), prod(shape)
        if key not in self._constants or self._constants[key].size < size:
            self._constants[key] = np.full(size, value, dtype)
        return self._constants[key][:size].reshape(shape)


def _round_codes(
    scaled: np.ndarray, signs_from: np.ndarray, fmt: Minifloat, scratch: Scratch, out: np.ndarray
) -> None:
    """Write into `out` the codes of float32 magnitudes `scaled` (<= fmt.max_value; overwritten),
    with the signs of `signs_from`.

    Adding c = 2**(e + 23 - m), where e is the value's binade (at least fmt.min_exponent) and m the
    mantissa bits, leaves exactly the format's precision, rounded half to even by the FPU. The sum's
    bits then hold c's exponent E = e + 150 - m and the rounded value q in units of 2**(e - m); the
    code is q + 2**m * (e - min_exponent), computed modulo the code's width.
    """
    m, bits, shape = fmt.mantissa_bits, scaled.view(np.uint32), scaled.shape
    floor = scratch.full((127 + fmt.min_exponent) << 23, np.uint32, shape)
    binade = np.maximum(bits, floor, out=scratch("binade", np.uint32, shape))  # subnormals: one grid
    binade &= 0x7F800000
    binade += (23 - m) << 23
    scaled += binade.view(np.float32)
    combined = np.right_shift(bits, 23 - m, out=binade)  # E << m, since q's bits sit below bit 23 - m
    combined += bits  # q, in the low bits
    np.copyto(out, combined, casting="unsafe")  # keeps the low bits
    out -= ((150 - m + fmt.min_exponent) << m) % (1 << (8 * out.itemsize))
    sign = np.signbit(signs_from, out=scratch("sign", np.bool_, shape)).view(np.uint8)
    code = out.dtype.type  # uint8, or uint16 for F16
    out |= np.multiply(sign, code(1 << (fmt.bits - 1)), out=scratch("sign_bit", code, shape))


def _place_codes(codes: np.ndarray, fmt: Minifloat, out: np.ndarray) -> None:
    """Write into float32 `out` each code's value times 2**-(126 + fmt.min_exponent).

    The code's exponent and mantissa, shifted into float32's fields, keep their value up to that power
    of two (subnormals become float32 denormals); the sign comes from reading the code as a signed
    integer, whose extension is then cleared.
    """
    bits = out.view(np.int32)
    bits[...] = codes.view(np.int8 if fmt.bits <= 8 else np.int16)
    shift = 23 - fmt.mantissa_bits
    bits <<= shift
    bits &= np.array(0x80000000 | ((1 << (shift + fmt.bits - 1)) - 1), np.uint32).view(np.int32)


# ---- F32, F16, BF16 --------------------------------------------------------------------------------


def _encode_f32(values: np.ndarray) -> dict[str, np.ndarray]:
    flat = _flat_f32(values)
    _refuse(_largest_magnitude(flat), np.inf, "F32", flat)
    return {"": flat}


def _decode_f32(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    return _entry(entries, "", np.float32, prod(shape)).reshape(shape)


def _encode_f16(values: np.ndarray) -> dict[str, np.ndarray]:
    # Our own rounding: numpy's float16 cast is several times slower.
    flat, scratch = _flat_f32(values), Scratch()
    out = np.empty(flat.size, np.uint16)
    for part in _chunks(flat.size, CHUNK_BLOCKS * BLOCK):
        _refuse(_largest_magnitude(flat[part]), F16_LIMIT, "F16", flat[part])
        magnitude = np.abs(flat[part], out=scratch("magnitude", np.float32, flat[part].shape))
        _round_codes(magnitude, flat[part], FP16, scratch, out[part])
    return {"": out.view(np.float16)}


def _decode_f16(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    stored = _entry(entries, "", np.float16, prod(shape)).view(np.uint16)
    out = np.empty(stored.size, np.float32)
    for part in _chunks(stored.size, CHUNK_BLOCKS * BLOCK):
        _place_codes(stored[part], FP16, out[part])
        out[part] *= np.float32(2.0**112)
    return out.reshape(shape)


def _encode_bf16(values: np.ndarray) -> dict[str, np.ndarray]:
    flat, scratch = _flat_f32(values), Scratch()
    bits, out = flat.view(np.uint32), np.empty(flat.size, np.uint16)
    for part in _chunks(flat.size, CHUNK_BLOCKS * BLOCK):
        _refuse(_largest_magnitude(flat[part]), BF16_LIMIT, "BF16", flat[part])
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


def scale_exponents(absmax: np.ndarray, fmt: Minifloat) -> np.ndarray:
    """Smallest k >= -127 (E8M0's least) with absmax <= fmt.max_value * 2**k; absmax < 2**127."""
    mantissa, exponent = np.frexp(absmax)  # absmax = mantissa * 2**exponent, mantissa in [0.5, 1)
    top_mantissa, top_exponent = np.frexp(fmt.max_value)  # 448 = 0.875 * 2**9, 6 = 0.75 * 2**3
    exponent -= top_exponent
    exponent += mantissa > top_mantissa
    return np.maximum(exponent, -127, out=exponent)


def quantize_blocks(
    blocks: np.ndarray, fmt: Minifloat, name: str
) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """Yield (rows, codes, k) for chunks of `blocks` (rows of 32 float32 values): each value's code
    (uint8, sign in the format's top bit) and each block's scale exponent k (scale 2**k).

    `codes` is a work array, overwritten by the next chunk. Refuses (PayloadError naming encoding
    `name`) values that are not finite or reach SCALED_LIMIT.
    """
    scratch = Scratch()
    starts = np.arange(0, CHUNK_BLOCKS * BLOCK, BLOCK)
    for rows in _chunks(len(blocks), CHUNK_BLOCKS):
        chunk = blocks[rows]
        magnitude = scratch("magnitude", np.int32, chunk.shape)
        np.bitwise_and(chunk.view(np.int32), 0x7FFFFFFF, out=magnitude)
        # Each block's largest magnitude, compared as integers (faster than floats; NaN is largest).
        absmax = np.maximum.reduceat(magnitude.reshape(-1), starts[: len(chunk)]).view(np.float32)
        _refuse(float(absmax.max()), SCALED_LIMIT, name, chunk)
        k = scale_exponents(absmax, fmt)
        scaled = magnitude.view(np.float32)
        scaled *= _pow2(-k)[:, None]  # exact: a power of two
        codes = scratch("codes", np.uint8, chunk.shape)
        _round_codes(scaled, chunk, fmt, scratch, codes)
        yield rows, codes, k


def _e4m3_times(codes: np.ndarray, factors: np.ndarray, out: np.ndarray, scratch: Scratch) -> None:
    """Write E4M3 `codes` (rows of 32) times each row's factor into `out`; NaN codes raise ValueError."""
    if np.bitwise_and(codes, 0x7F, out=scratch("nan", np.uint8, codes.shape)).max(initial=0) == 0x7F:
        raise ValueError("holds E4M3 NaN codes (0x7F or 0xFF)")
    _place_codes(codes, E4M3, out)  # value * 2**-120
    factors = factors.astype(np.float64) * 2.0**120
    if factors.max(initial=0.0) >= 2.0**127:
        out *= np.float32(2.0**120)  # a scale above 2**7: apply 2**120 on its own to stay finite
        factors *= 2.0**-120
    out *= factors.astype(np.float32)[:, None]


def _encode_f8(values: np.ndarray) -> dict[str, np.ndarray]:
    blocks = _as_blocks(_flat_f32(values))
    codes, scales = np.empty(blocks.shape, np.uint8), np.empty(len(blocks), np.float32)
    for rows, chunk_codes, k in quantize_blocks(blocks, E4M3, "F8_E4M3"):
        codes[rows], scales[rows] = chunk_codes, _pow2(k)
    return {"": codes.reshape(-1), "@scale": scales}


def _decode_f8(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    blocks = _block_count(prod(shape))
    codes = _entry(entries, "", np.uint8, blocks * BLOCK).reshape(blocks, BLOCK)
    scales = _entry(entries, "@scale", np.float32, blocks)
    out, scratch = np.empty((blocks, BLOCK), np.float32), Scratch()
    for rows in _chunks(blocks, CHUNK_BLOCKS):
        _e4m3_times(codes[rows], scales[rows], out[rows], scratch)
    return _unpad(out, shape)


def _encode_f8_tensor(values: np.ndarray) -> dict[str, np.ndarray]:
    flat, scratch = _flat_f32(values), Scratch()
    absmax = _largest_magnitude(flat)
    _refuse(absmax, SCALED_LIMIT, "F8_E4M3_TENSOR", flat)
    exponent = scale_exponents(np.array([absmax], np.float32), E4M3)
    inverse = _pow2(-exponent)[0]
    codes = np.empty(flat.size, np.uint8)
    for part in _chunks(flat.size, CHUNK_BLOCKS * BLOCK):
        scaled = np.abs(flat[part], out=scratch("magnitude", np.float32, flat[part].shape))
        scaled *= inverse
        _round_codes(scaled, flat[part], E4M3, scratch, codes[part])
    return {"": codes, "@scale": _pow2(exponent)}


def _decode_f8_tensor(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    codes = _as_blocks(_entry(entries, "", np.uint8, prod(shape)))
    scale = _entry(entries, "@scale", np.float32, 1)
    out, scratch = np.empty(codes.shape, np.float32), Scratch()
    for rows in _chunks(len(codes), CHUNK_BLOCKS):
        _e4m3_times(codes[rows], np.repeat(scale, len(out[rows])), out[rows], scratch)
    return _unpad(out, shape)


def _encode_f4(values: np.ndarray) -> dict[str, np.ndarray]:
    blocks = _as_blocks(_flat_f32(values))
    packed, scales = np.empty((len(blocks), BLOCK // 2), np.uint8), np.empty(len(blocks), np.uint8)
    for rows, codes, k in quantize_blocks(blocks, E2M1, "F4"):
        # Two codes per byte, the earlier value in the low nibble: read as little-endian uint16 pairs,
        # (pair >> 4) | pair has the later code in bits 4-7 over the earlier one in bits 0-3.
        pairs = codes.view(np.uint16)
        np.copyto(packed[rows], (pairs >> 4) | pairs, casting="unsafe")
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
