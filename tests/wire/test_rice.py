"""Rice-coded indices (wire/rice.py through wire/sparse.py): exact round trips of any sorted indices, the
bytes per coefficient they reach at the issue's settings, and hostile bytes refused with the reason."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slowlink.algorithms import demo as d
from slowlink.errors import PayloadError
from slowlink.wire import rice
from slowlink.wire.sparse import HEADER, decode_sparse, encode_sparse, packed_size


@st.composite
def coefficients(draw):
    chunk_numel = draw(st.integers(1, 5000))
    k, chunks = draw(st.integers(1, min(chunk_numel, 64))), draw(st.integers(1, 4))
    rows = [
        draw(st.lists(st.integers(0, chunk_numel - 1), min_size=k, max_size=k, unique=True))
        for _ in range(chunks)
    ]
    values = draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=chunks * k, max_size=chunks * k))
    return np.array(rows, np.int64), np.array(values, np.float32).reshape(chunks, k), chunk_numel


@settings(max_examples=100, deadline=None)
@given(coefficients())
def test_rice_coded_indices_round_trip_exactly(case):
    indices, values, chunk_numel = case
    data = encode_sparse(indices, values, chunk_numel, values_as="f32", index_coding="rice")
    got_indices, got_values = decode_sparse(
        data, chunks=indices.shape[0], k=indices.shape[1], chunk_numel=chunk_numel
    )
    order = np.argsort(indices, axis=1)
    assert np.array_equal(got_indices, np.take_along_axis(indices, order, 1))
    assert np.array_equal(got_values.view(np.uint32), np.take_along_axis(values, order, 1).view(np.uint32))
    shortest = encode_sparse(indices, values, chunk_numel, values_as="f32")
    assert len(shortest) == min(len(data), packed_size(*indices.shape, chunk_numel, "f32"))


def bytes_per_coefficient(k: int, values_as: str, chunk_numel: int = 4096, chunks: int = 400) -> float:
    rng = np.random.default_rng(k)
    indices = np.stack([rng.choice(chunk_numel, k, replace=False) for _ in range(chunks)])
    values = d.quantize(torch.randn(chunks, k, generator=torch.Generator().manual_seed(k)), values_as).numpy()
    return len(encode_sparse(indices, values, chunk_numel, values_as=values_as)) / (chunks * k)


def test_the_issues_settings_cost_at_most_one_and_a_quarter_bytes_per_coefficient():
    # SparseLoCo's 1.56% of each 64×64 chunk with 2-bit values, and DeMo's topk=32 with signs: index and value
    assert bytes_per_coefficient(64, "2bit") <= 1.20  # templar packs 1.75 (12-bit index + 2-bit value)
    assert bytes_per_coefficient(32, "sign") <= 1.20
    assert (
        bytes_per_coefficient(8, "sign") < 1.5
    )  # sparser chunks cost more: log2(4096/8) + 1.5 bits an index
    # a chunk sent whole: every gap is 0, one bit (b = 0) where packing takes 4, plus the sign's bit
    assert bytes_per_coefficient(16, "sign", chunk_numel=16) == pytest.approx(2 / 8, abs=0.01)
    # packed indices are kept where they are shorter: one index of a 2-value chunk, 1 bit against a 5-byte prefix
    one = encode_sparse(np.array([[1]]), np.ones((1, 1), np.float32), 2, values_as="f32")
    assert len(one) == packed_size(1, 1, 2, "f32")


def rice_payload():
    indices = np.array([[1, 5, 9], [0, 2, 15]])
    return encode_sparse(indices, np.ones((2, 3), np.float32), 16, values_as="f32", index_coding="rice")


def test_hostile_rice_bytes_are_refused_with_the_reason():
    good = rice_payload()
    decode_sparse(good, chunks=2, k=3, chunk_numel=16)
    prefix = HEADER.size
    cases = {
        "parameter": good[:prefix] + rice.PREFIX.pack(9) + good[prefix + rice.PREFIX.size :],
        "do not hold": good[: prefix + rice.PREFIX.size] + b"\xff",  # unary codes cut off before their end
        "one bits": good[: prefix + 2] + bytes([good[prefix + 2] | 1]) + good[prefix + 3 :],  # in the padding
        "truncated": good[:-1],
        "padded": good + b"\0",
    }
    for words, data in cases.items():
        with pytest.raises(PayloadError, match=words):
            decode_sparse(data, chunks=2, k=3, chunk_numel=16)
    # gaps that add up past the chunk's end: 15 in a chunk of 13 (both take 4-bit remainders)
    far = encode_sparse(
        np.array([[0, 1, 15]]), np.ones((1, 3), np.float32), 16, values_as="f32", index_coding="rice"
    )
    with pytest.raises(PayloadError, match=r"outside \[0, 13\)"):
        decode_sparse(far, chunks=1, k=3, chunk_numel=13)
