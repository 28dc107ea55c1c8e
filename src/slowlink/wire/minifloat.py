"""Float formats narrower than float32 (E4M3, E2M1, IEEE half) and the float32 arithmetic that rounds to
them and back, vectorised with numpy: the numeric core under the wire encodings (`encodings.py`).

A code is the format's bit pattern in a uint8 (uint16 for half): sign in the top bit of the format,
then exponent and mantissa. Two roundings give identical codes, both to nearest with ties to even:
`round_codes` serves any magnitude the format can hold, subnormals included; `split_codes` takes fewer
passes but only serves values in the format's normal range, so callers send the rest to `round_codes`.
"""

import math
from dataclasses import dataclass
from math import prod

import numpy as np


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

    @property
    def top_exponent(self) -> int:
        """The exponent of `max_value`: 8 for E4M3's 448 = 1.75 * 2**8, 2 for E2M1's 6."""
        return math.frexp(self.max_value)[1] - 1

    @property
    def top_fraction(self) -> int:
        """The 23-bit float32 fraction field of `max_value`: 0x600000 for 1.75, 0x400000 for 1.5."""
        return int(np.array(self.max_value, np.float32).view(np.uint32)) & 0x7FFFFF

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


class Scratch:
    """Work arrays reused from chunk to chunk: a fresh 1 MiB array per step costs page faults.

    Each view asked for is kept: building one costs microseconds, and a codec asks for a dozen per chunk.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}
        self._views: dict[tuple[str, type, tuple[int, ...]], np.ndarray] = {}
        self._constants: dict[tuple[int, str], np.ndarray] = {}

    def __call__(self, name: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        view = self._views.get((name, dtype, shape))
        if view is not None:
            return view
        size = prod(shape) * np.dtype(dtype).itemsize
        if name not in self._buffers or self._buffers[name].size < size:
            self._buffers[name] = np.empty(size, np.uint8)
            self._views = {key: kept for key, kept in self._views.items() if key[0] != name}
        view = self._views[name, dtype, shape] = self._buffers[name][:size].view(dtype).reshape(shape)
        return view

    def full(self, value: int, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        """An array of `value`: numpy's maximum against one is several times faster than against a scalar."""
        key, size = (value, np.dtype(dtype).str), prod(shape)
        if key not in self._constants or self._constants[key].size < size:
            self._constants[key] = np.full(size, value, dtype)
        return self._constants[key][:size].reshape(shape)


def pow2(exponents: np.ndarray) -> np.ndarray:
    """2**k as float32 for integers -127 <= k <= 127, built from bits (np.ldexp takes five times as long)."""
    k = np.asarray(exponents, np.int32)
    bits = (k + 127) << 23
    bits[k == -127] = 0x00400000  # 2**-127 is a float32 denormal
    return bits.view(np.float32)


def scale_exponents(absmax: np.ndarray, fmt: Minifloat) -> np.ndarray:
    """Smallest k >= -127 (E8M0's least) with absmax <= fmt.max_value * 2**k; absmax < 2**127.

    A block of zeros gets k = -fmt.top_exponent - 1 (frexp(0) is (0, 0)): -9 for E4M3, -3 for E2M1.
    """
    mantissa, exponent = np.frexp(absmax)  # absmax = mantissa * 2**exponent, mantissa in [0.5, 1)
    top_mantissa, top_exponent = np.frexp(fmt.max_value)  # 448 = 0.875 * 2**9, 6 = 0.75 * 2**3
    exponent -= top_exponent
    exponent += mantissa > top_mantissa
    return np.maximum(exponent, -127, out=exponent)


def round_codes(
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


def split_codes(
    values: np.ndarray, offsets: np.ndarray, fmt: Minifloat, scratch: Scratch, out: np.ndarray
) -> None:
    """Write into uint8 `out` the codes of float32 `values` over 2**k, each in the normal range of `fmt`
    ([2**min_exponent, max_value] * 2**k, k from -100 to 96); `offsets` holds (k + 126 + min_exponent)
    << m modulo 256 for each value (or one for all). Values outside that range get wrong codes.

    Veltkamp's splitting: with C = 2**(23 - m) + 1 and g = C*x, hi = g + (x - g), each step rounded to
    float32, is x rounded to m + 1 significant bits, to nearest with ties to even (checked on every
    float32 of a binade; scaling by 2**k changes nothing while nothing over- or underflows). hi's bits
    from 23 - m up are its biased exponent E and its m kept fraction bits, and the code is
    2**m * (E - 127 - k - min_exponent + 1) plus those bits: that field less the offset.
    """
    m, shape = fmt.mantissa_bits, values.shape
    high = np.multiply(values, np.float32(2 ** (23 - m) + 1), out=scratch("split_high", np.float32, shape))
    low = np.subtract(values, high, out=scratch("split_low", np.float32, shape))
    high += low
    np.right_shift(high.view(np.uint32), 23 - m, out=out, casting="unsafe")  # keeps the low 8 bits
    out -= offsets
    sign = np.signbit(values, out=scratch("sign", np.bool_, shape)).view(np.uint8)
    sign *= np.uint8(1 << (fmt.bits - 1))
    out |= sign


def place_codes(codes: np.ndarray, fmt: Minifloat, out: np.ndarray) -> None:
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
