"""The scaled minifloat encodings against a plain reference, bit for bit: scales found by comparisons
in float64, codes by ml_dtypes' casts, values by float32 products. The data is built to hit every edge
of the codecs and every path through them: zeros of both signs, float32 denormals, E4M3 and E2M1
subnormals, ties, block maxima on and just off the format's largest value, scales from 2**-127 to
2**119, and chunks that the fast path serves, partly serves, or leaves to the exact one."""

import ml_dtypes
import numpy as np
import pytest

from slowlink.errors import PayloadError
from slowlink.wire import encodings
from slowlink.wire.encodings import ENCODINGS

FORMATS = {  # name: (ml_dtypes type, largest value, k of an all-zero block)
    "F8_E4M3": (ml_dtypes.float8_e4m3fn, 448.0, -9),
    "F4": (ml_dtypes.float4_e2m1fn, 6.0, -3),
}


def reference_exponents(absmax: np.ndarray, top: float, zero_k: int) -> np.ndarray:
    """The least k >= -127 with absmax <= top * 2**k, by exact float64 comparisons from below.

    A block of zeros takes `zero_k`, what the encoders have always given it (numpy's frexp(0) is 0, 0).
    """
    safe = np.where(absmax > 0, absmax, 1.0)
    k = np.floor(np.log2(safe / top)).astype(np.int64) - 2  # at most the answer: log2 errs by far less
    for _ in range(4):
        k += absmax > top * np.ldexp(1.0, k)
    k = np.maximum(k, -127)
    k[absmax == 0] = zero_k
    return k


def reference_encode(values: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes, k) per block of 32, zero-padded: ml_dtypes' rounding of block / 2**k (exact in float64)."""
    dtype, top, zero_k = FORMATS[name]
    padded = np.zeros(-(-values.size // 32) * 32)
    padded[: values.size] = values.reshape(-1)
    blocks = padded.reshape(-1, 32)
    k = reference_exponents(np.abs(blocks).max(axis=1), top, zero_k)
    codes = (blocks / np.ldexp(1.0, k)[:, None]).astype(dtype).view(np.uint8)
    return codes, k


FAST = ["plain", "few_small", "maxima", "ties", "large", "small", "boundary"]  # the fast path serves these
EXACT = ["wide", "huge", "limit", "tiny", "zeros", "subnormal_ties"]  # and leaves these to the exact one


def edge_segment(rng: np.random.Generator, kind: str, blocks: int = 64) -> np.ndarray:
    """`blocks` blocks of 32 float32 values of one kind (a chunk's worth where the test shrinks chunks).

    Each block has its own scale, and all its values are within 2**10 of its largest, unless the kind
    says otherwise."""
    low, high = {"large": (70, 104), "huge": (105, 126), "small": (-92, -60), "tiny": (-127, -100)}.get(
        kind, (-60, 60)
    )
    exponents = rng.integers(low, high, (blocks, 1))  # of each block's largest magnitude, about
    signs = rng.choice([-1.0, 1.0], (blocks, 32))
    values = signs * np.exp2(exponents + rng.uniform(-10, 0, (blocks, 32)))
    if kind == "wide":  # magnitudes over 2**-40 to 2**40 inside each block: many subnormals and zeros
        values *= np.exp2(rng.uniform(-40, 40, values.shape))
    elif kind == "few_small":  # a handful of blocks, each with a zero or one value under the normal range
        rows = rng.choice(blocks, 6, replace=False)
        values[rows, rng.integers(0, 32, 6)] *= np.exp2(-rng.integers(6, 40, 6))
        values[rows[:2], 5] = [0.0, -0.0]
    elif kind == "limit":  # up to float32's largest, under 2**127
        values[0, 0] = 1.7e38
    elif kind == "tiny":  # scales down to 2**-127, float32 denormals among them
        values[: blocks // 2] *= 2.0**-50
    elif kind == "zeros":
        values[:] = 0.0
        values[1::2] = -0.0
        values[3, 7] = 2.0**-140  # a denormal alone in a block of zeros
    values = values.astype(np.float32)
    if kind in ("maxima", "ties", "subnormal_ties"):
        at_maximum(rng, values, ties=kind != "maxima", subnormal=kind == "subnormal_ties")
    if kind == "boundary":
        at_normal_boundary(rng, values)
    return values.reshape(-1)


def at_maximum(rng: np.random.Generator, values: np.ndarray, ties: bool, subnormal: bool) -> None:
    """Put each block's largest magnitude on, one float32 step above or one under 1.75 * 2**e (E4M3's
    448 times the scale 2**(e - 8), and where the scale changes); with `ties`, make the other values
    midpoints between neighbouring E4M3 values: in a binade 2**f the step is 2**(f - 3), and under
    2**(e - 14) (subnormal at that scale) it is 2**(e - 17)."""
    blocks, shape = len(values), (len(values), 31)
    e = rng.integers(-60, 60, blocks)
    top = np.ldexp(np.float32(1.75), e).astype(np.float32)
    nudge = rng.integers(-1, 2, blocks).astype(np.int32)  # one float32 step down, none, or up
    values[:, 0] = (top.view(np.int32) + nudge).view(np.float32)
    values[:, 1:] = top[:, None] * rng.uniform(2.0**-9, 1.0, shape)
    if ties and subnormal:
        values[:, 1:] = (2 * rng.integers(0, 8, shape) + 1) * np.ldexp(1.0, e - 18)[:, None]
    elif ties:
        binades = e[:, None] + rng.integers(-12, 0, shape)
        values[:, 1:] = (2 * rng.integers(8, 16, shape) + 1) * np.ldexp(1.0, binades - 4)
    values[:, 1:] *= rng.choice([-1, 1], shape)


def at_normal_boundary(rng: np.random.Generator, values: np.ndarray) -> None:
    """In a few blocks scaled by exactly 2**k (largest magnitude 448 * 2**k), put values where E4M3's
    subnormals meet its normals at 2**(k - 6): on it, a float32 step off it, at the tie 7.5 * 2**(k - 9)
    and about it, and in (1.75, 2) * 2**(k - 7), where mu already counts the next binade."""
    rows = rng.choice(len(values), 8, replace=False)
    k = rng.integers(-60, 50, 8)
    values[rows] = np.ldexp(np.float32(1.0), k - 3)[:, None] * rng.uniform(1, 2, (8, 32))
    values[rows, 0] = np.ldexp(np.float32(448.0), k)
    edge = np.array(
        [1.0, 1 - 2.0**-24, 1 + 2.0**-23, 0.9375, 0.9375 + 2.0**-24, 0.90625, 0.96875, 0.88, 0.999]
    )
    values[rows, 1:10] = np.ldexp(edge, (k - 6)[:, None]) * rng.choice([-1, 1], (8, 9))


RECIPES = {  # recipe: (segment kinds, blocks per chunk)
    "fast_paths_in_small_chunks": (FAST * 2, 64),
    "every_path_in_small_chunks": (FAST + EXACT, 64),
    "fast_kinds_in_one_chunk": (FAST * 3, None),
    "every_kind_in_one_chunk": (FAST + EXACT, None),
}


def edge_values(seed: int, kinds: list[str]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    segments = [edge_segment(rng, kind) for kind in rng.permutation(kinds)]
    return np.concatenate([*segments, edge_segment(rng, "wide", 1)[:21]])  # and a partial block


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("name", list(FORMATS))
def test_block_encodings_equal_the_reference_bit_for_bit_on_edge_values(name, recipe, monkeypatch):
    kinds, chunk_blocks = RECIPES[recipe]
    if chunk_blocks:
        monkeypatch.setattr(encodings, "CHUNK_BLOCKS", chunk_blocks)
    values = edge_values(len(recipe), kinds)
    codes, k = reference_encode(values, name)
    entries = ENCODINGS[name].encode(values)
    if name == "F8_E4M3":
        assert np.array_equal(entries[""], codes.reshape(-1))
        scales = np.ldexp(1.0, k).astype(np.float32)
        assert np.array_equal(entries["@scale"].view(np.uint32), scales.view(np.uint32))
    else:
        assert np.array_equal(entries[""], (codes[:, 0::2] | codes[:, 1::2] << 4).reshape(-1))
        assert np.array_equal(entries["@scale"], k + 127)
    dtype = FORMATS[name][0]
    expected = (codes.view(dtype).astype(np.float64) * np.ldexp(1.0, k)[:, None]).astype(np.float32)
    decoded = ENCODINGS[name].decode(entries, values.shape)
    assert np.array_equal(decoded.view(np.uint32), expected.reshape(-1)[: values.size].view(np.uint32))


def test_f8_tensor_scale_equals_the_reference_bit_for_bit_on_edge_values():
    rng = np.random.default_rng(11)
    for kind in FAST + EXACT:
        values = edge_segment(rng, kind)
        absmax = np.abs(values.astype(np.float64)).max(keepdims=True)
        k = reference_exponents(absmax, 448.0, -9)
        expected = (values / np.ldexp(1.0, k)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        entries = ENCODINGS["F8_E4M3_TENSOR"].encode(values)
        assert np.array_equal(entries[""], expected), kind
        assert entries["@scale"].tolist() == [np.ldexp(1.0, k[0])], kind


def test_f8_decode_is_the_float32_product_of_each_code_and_any_finite_scale():
    rng = np.random.default_rng(12)
    blocks = 3000
    codes = rng.integers(0, 256, (blocks, 32), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x80  # not NaN
    scale_bits = rng.integers(0, 0x7F800000, blocks, dtype=np.uint32) | (rng.integers(0, 2, blocks) << 31)
    scales = scale_bits.astype(np.uint32).view(np.float32)  # finite, any sign, denormals and zeros
    expected = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * scales[:, None]
    decoded = ENCODINGS["F8_E4M3"].decode({"": codes.reshape(-1), "@scale": scales}, (blocks * 32,))
    assert np.array_equal(decoded.view(np.uint32), expected.reshape(-1).view(np.uint32))


@pytest.mark.parametrize("bits", [0x7F800001, 0x7FC00000, 0x7FE00001, 0x7FFFFFFF, 0xFFE00001, 0xFFFFFFFF])
@pytest.mark.parametrize("name", ["F8_E4M3", "F4"])
def test_nan_of_every_payload_is_refused_in_the_first_chunk_that_holds_one(name, bits, monkeypatch):
    # The fast path sees some NaNs only as small values, in the blocks it leaves over; the refusal must
    # still come from the first chunk with a NaN and count that chunk's (one here, not two).
    monkeypatch.setattr(encodings, "CHUNK_BLOCKS", 64)
    for neighbours in (np.zeros(8192, np.float32), np.random.default_rng(13).standard_normal(8192)):
        values = neighbours.astype(np.float32)
        values[[1000, 5000]] = np.array(bits, np.uint32).view(np.float32)
        with pytest.raises(PayloadError, match="^1 values are NaN or infinite"):
            ENCODINGS[name].encode(values)
