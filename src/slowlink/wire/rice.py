"""Rice codes of sorted chunk-local indices (wire/sparse.py's "rice" index coding): each chunk's indices, in
increasing order, become gaps g = i_j − i_(j−1) − 1 (the first: i_0), each written as q = g >> b in unary
(q one bits, then a zero) and the low b bits. One b per tensor, the one that makes the fewest bits. k indices
out of n uniformly spread cost about log2(n/k) + 1.5 bits each, against log2(n) packed.

    b          u8, the Rice parameter
    unary      the unary quotients, then zero bits to a byte: the reader counts the codes' zeros to find
               their end, so no length is stored (4 bytes a tensor fewer)
    remainders count·b bits, big-endian bit order, padded to a byte
Vectorized over every index at once: no Python loop per index or per chunk.
"""

import struct

import numpy as np

from ..errors import PayloadError
from .bits import pack_uints, unpack_uints

PREFIX = struct.Struct("<B")


def gaps_of(sorted_indices: np.ndarray) -> np.ndarray:
    """(chunks, k) gaps of (chunks, k) indices, each row increasing."""
    gaps = np.diff(sorted_indices, axis=1, prepend=-1) - 1
    return gaps.astype(np.int64)


def best_parameter(gaps: np.ndarray, index_bits: int) -> tuple[int, int]:
    """(b, total bits) of the Rice parameter b ∈ [0, index_bits] that codes `gaps` in the fewest bits: the
    cost is convex in b, with its minimum next to log2 of the mean gap: three tries around it suffice."""
    flat = gaps.ravel()
    guess = int(np.log2(max(float(flat.mean()), 1.0))) if flat.size else 0
    tries = range(max(0, guess - 1), min(index_bits, guess + 1) + 1)
    return min(((b, int((flat >> b).sum()) + flat.size * (b + 1)) for b in tries), key=lambda c: c[1])


def rice_size(count: int, b: int, bits: int) -> int:
    """Bytes of the coded indices: the prefix, the unary quotients and the remainders, each padded to a byte."""
    return PREFIX.size + -(-(bits - count * b) // 8) + -(-count * b // 8)


def encode_rice(sorted_indices: np.ndarray, b: int) -> bytes:
    flat = gaps_of(sorted_indices).ravel()
    quotients = flat >> b
    unary = np.ones(int(quotients.sum()) + flat.size, np.uint8)
    unary[np.cumsum(quotients + 1) - 1] = 0  # each code's terminating zero
    unary_bytes = np.packbits(unary).tobytes()
    remainders = pack_uints(flat & ((1 << b) - 1), b) if b else b""
    return PREFIX.pack(b) + unary_bytes + remainders


ZERO_BITS = np.array([8 - bin(byte).count("1") for byte in range(256)], np.int64)  # a byte's zero bits


def _unary_bytes(body: np.ndarray, count: int) -> np.ndarray:
    """The front of `body` that holds the unary quotients' `count` zeros (all of it when it holds fewer): what
    is unpacked to bits, not the remainders and values after it."""
    zeros = np.cumsum(ZERO_BITS[body])
    return body[: int(np.searchsorted(zeros, count)) + 1] if count else body[:0]


def decode_rice(data: bytes, chunks: int, k: int, index_bits: int) -> tuple[np.ndarray, int]:
    """((chunks, k) indices, increasing in each chunk; the bytes read) from the front of `data`."""
    count = chunks * k
    if len(data) < PREFIX.size:
        raise PayloadError("the Rice-coded indices are truncated before their parameter")
    (b,) = PREFIX.unpack_from(data)
    if b > index_bits:
        raise PayloadError(f"Rice parameter {b} cannot be this tensor's: its indices take {index_bits} bits")
    unary = np.unpackbits(_unary_bytes(np.frombuffer(data, np.uint8, offset=PREFIX.size), count))
    ends = np.flatnonzero(unary == 0)[:count]
    if ends.size < count:
        raise PayloadError(
            f"the unary quotients do not hold {count} codes: truncated, or the wrong count for this tensor"
        )
    used = int(ends[-1]) + 1 if count else 0
    unary_size = -(-used // 8)
    if unary[used : 8 * unary_size].any():
        raise PayloadError("the unary quotients are followed by one bits where a coder pads with zeros: "
                           "corrupted, or the wrong count for this tensor")  # fmt: skip
    quotients = np.diff(ends, prepend=-1) - 1
    start = PREFIX.size + unary_size
    end = start + -(-count * b // 8)
    if end > len(data):
        raise PayloadError("the Rice-coded indices are truncated in their remainders")
    remainders = unpack_uints(data[start:end], count, b) if b else np.zeros(count, np.int64)
    gaps = ((quotients.astype(np.int64) << b) | remainders).reshape(chunks, k)
    return np.cumsum(gaps + 1, axis=1) - 1, end
