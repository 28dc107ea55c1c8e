"""Bit fields packed a word at a time (wire/bits.py) pinned to the definition, each number's bits most
significant first (its bit-plane path): the same bytes for every width, and back."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slowlink.wire import bits


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 32), st.integers(0, 300), st.integers(0, 2**32 - 1))
def test_packed_fields_are_the_bit_planes_bytes_and_unpack_exactly(width, count, seed):
    numbers = np.random.default_rng(seed).integers(0, 1 << width, count, dtype=np.int64)
    packed = bits.pack_uints(numbers, width)
    assert packed == bits._pack_planes(numbers, width)
    assert len(packed) == -(-count * width // 8)
    unpacked = bits.unpack_uints(packed + b"\xff\x01", count, width)  # what follows is not read
    assert unpacked.dtype == np.int64 and np.array_equal(unpacked, numbers)


def test_fields_that_share_bytes_are_big_endian():
    assert bits.pack_uints(np.array([0xABC, 0x123]), 12) == bytes([0xAB, 0xC1, 0x23])
    assert bits.pack_uints(np.array([3, 0, 1]), 2) == bytes([0b11000100])  # zero bits pad the last byte
    assert bits.pack_uints(np.array([1]), 9) == bytes([0, 0x80])  # 9 bits: no word holds whole bytes of them
