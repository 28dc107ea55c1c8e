"""Unsigned numbers as fixed-width bit fields, big-endian bit order, padded with zero bits to a byte: the
packing of wire/sparse.py's indices and 2-bit codes and of wire/rice.py's remainders. Whole arrays at once:
the fields that end on a byte boundary together (two of 12 bits, four of 6) are one 64-bit word's low bytes.
"""

import math

import numpy as np


def _fields_per_word(bits: int) -> int | None:
    """How many fields end together on a byte boundary, when they fit in a 64-bit word (None: they do not)."""
    fields = 8 // math.gcd(bits, 8)
    return fields if fields * bits <= 64 else None


def _pack_planes(numbers: np.ndarray, bits: int) -> bytes:
    """The definition: each number's bits, most significant first, one after another."""
    shifts = np.arange(bits - 1, -1, -1, dtype=np.uint64)
    return np.packbits(((numbers.astype(np.uint64)[:, None] >> shifts) & 1).astype(np.uint8)).tobytes()


def _unpack_planes(data: bytes, count: int, bits: int) -> np.ndarray:
    planes = np.unpackbits(np.frombuffer(data, np.uint8), count=count * bits).reshape(count, bits)
    return planes.astype(np.int64) @ (np.int64(1) << np.arange(bits - 1, -1, -1, dtype=np.int64))


def _byte_fields(bits: int) -> np.ndarray:
    """(256, 8 / bits) int64: the fields of each byte, most significant first."""
    shifts = np.arange(8 - bits, -1, -bits, dtype=np.int64)
    return (np.arange(256, dtype=np.int64)[:, None] >> shifts) & ((1 << bits) - 1)


BYTE_FIELDS = {bits: _byte_fields(bits) for bits in (1, 2, 4)}


def pack_uints(numbers: np.ndarray, bits: int) -> bytes:
    """`numbers` (each below 2**bits) as `bits`-bit fields: ceil(count·bits / 8) bytes."""
    numbers = np.asarray(numbers).ravel()
    fields = _fields_per_word(bits)
    if fields is None:
        return _pack_planes(numbers, bits)
    words = np.zeros(-(-numbers.size // fields) * fields, np.uint64)
    words[: numbers.size] = numbers
    words = words.reshape(-1, fields)
    word = words[:, 0].copy()
    for column in range(1, fields):
        word = (word << np.uint64(bits)) | words[:, column]
    size = fields * bits // 8  # the word's low bytes that hold its fields
    stream = word.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - size :]
    return stream.tobytes()[: -(-numbers.size * bits // 8)]


def unpack_uints(data: bytes, count: int, bits: int) -> np.ndarray:
    """(count,) int64 from the front of `data` (at least ceil(count·bits / 8) bytes), as pack_uints wrote."""
    if bits in BYTE_FIELDS:  # several fields a byte (2-bit codes, sign bits): one table look-up a byte
        used = np.frombuffer(data, np.uint8, -(-count * bits // 8))
        return BYTE_FIELDS[bits][used].ravel()[:count]
    fields = _fields_per_word(bits)
    if fields is None:
        return _unpack_planes(data, count, bits)
    size, words = fields * bits // 8, -(-count // fields)
    low = np.zeros(words * size, np.uint8)  # the words' low bytes, the last padded with zeros
    low[: -(-count * bits // 8)] = np.frombuffer(data, np.uint8, -(-count * bits // 8))
    stream = np.zeros((words, 8), np.uint8)
    stream[:, 8 - size :] = low.reshape(words, size)
    word = stream.view(">u8").ravel().astype(np.uint64)
    shifts = np.arange(fields - 1, -1, -1, dtype=np.uint64) * np.uint64(bits)
    numbers = (word[:, None] >> shifts) & np.uint64((1 << bits) - 1)
    return numbers.ravel()[:count].astype(np.int64)
