"""The packed sparse format (wire/sparse.py): exact round trips, the sizes it promises, and refusals."""

import numpy as np
import pytest
import torch

from slowlink.algorithms import demo as d
from slowlink.errors import PayloadError
from slowlink.wire.sparse import HEADER, decode_sparse, encode_sparse, index_bits, packed_size


def coefficients(chunks=6, k=8, chunk_numel=4096, seed=0):
    generator = torch.Generator().manual_seed(seed)
    indices = torch.stack([torch.randperm(chunk_numel, generator=generator)[:k] for _ in range(chunks)])
    return indices, torch.randn(chunks, k, generator=generator)


@pytest.mark.parametrize("values_as", d.VALUES)
@pytest.mark.parametrize("scale", d.VALUE_SCALES)
@pytest.mark.parametrize("chunk_numel", [4096, 26, 1000, 2])
def test_every_format_round_trips_exactly(values_as, scale, chunk_numel):
    indices, raw = coefficients(k=min(8, chunk_numel), chunk_numel=chunk_numel)
    values = d.quantize(raw, values_as, scale).numpy()
    order = np.argsort(indices.numpy(), axis=1)  # each chunk's coefficients come back sorted by index
    for coding in ("packed", "rice"):
        data = encode_sparse(indices.numpy(), values, chunk_numel, values_as=values_as, scale=scale,
                             index_coding=coding)  # fmt: skip
        if coding == "packed":
            assert len(data) == packed_size(6, indices.shape[1], chunk_numel, values_as, scale)
        got_indices, got_values = decode_sparse(data, chunks=6, k=indices.shape[1], chunk_numel=chunk_numel)
        assert np.array_equal(got_indices, np.take_along_axis(indices.numpy(), order, 1))
        assert np.array_equal(
            got_values.view(np.uint32), np.take_along_axis(values, order, 1).view(np.uint32)
        )
        again = encode_sparse(got_indices, got_values, chunk_numel, values_as=values_as, scale=scale,
                              index_coding=coding)  # fmt: skip
        assert again == data  # bit for bit


def test_indices_take_as_few_bits_as_the_chunk_needs():
    assert [index_bits(n) for n in (4096, 4097, 64, 26, 2, 1)] == [12, 13, 6, 5, 1, 1]
    # 1000 chunks of 64×64, k = 8: 8000 coefficients of 12 + 2 bits, one bf16 scale
    assert packed_size(1000, 8, 4096, "2bit") == HEADER.size + 12_000 + 2 + 2000
    assert packed_size(1000, 8, 4096, "sign", "chunk") == HEADER.size + 12_000 + 2000 + 1000
    assert packed_size(1000, 8, 4096, "bf16") == HEADER.size + 12_000 + 16_000


def test_values_not_yet_quantized_are_refused_not_rounded():
    indices, raw = coefficients()
    for values_as in ("bf16", "2bit", "sign"):
        with pytest.raises(PayloadError, match="quantize|bf16"):
            encode_sparse(indices.numpy(), raw.numpy() * 1.001, 4096, values_as=values_as)


def pack(indices, values, chunk_numel=16):
    return encode_sparse(np.asarray(indices), np.asarray(values, np.float32), chunk_numel, values_as="f32",
                         index_coding="packed")  # fmt: skip


def test_a_peers_bad_coefficients_are_rejected_with_the_reason():
    good = pack([[0, 5], [3, 15]], [[1.0, 2.0], [3.0, 4.0]])
    decode_sparse(good, chunks=2, k=2, chunk_numel=16)
    with pytest.raises(PayloadError, match="wrong count"):
        decode_sparse(good, chunks=2, k=3, chunk_numel=16)
    with pytest.raises(PayloadError, match="truncated"):
        decode_sparse(good[:-1], chunks=2, k=2, chunk_numel=16)
    with pytest.raises(PayloadError, match="header"):
        decode_sparse(good[:1], chunks=2, k=2, chunk_numel=16)
    with pytest.raises(PayloadError, match="format"):
        decode_sparse(b"XX" + good[2:], chunks=2, k=2, chunk_numel=16)
    # 13 indices fit in 4 bits; an index of 14 or 15 written by a hostile peer is out of range
    hostile = pack([[0, 5], [3, 15]], [[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(PayloadError, match=r"outside \[0, 13\)"):
        decode_sparse(hostile, chunks=2, k=2, chunk_numel=13)
    duplicate = bytearray(good)
    duplicate[HEADER.size] = 0x55  # indices 0101 0101: 5 and 5 in the first chunk
    with pytest.raises(PayloadError, match="twice"):
        decode_sparse(bytes(duplicate), chunks=2, k=2, chunk_numel=16)
    with pytest.raises(PayloadError, match="NaN"):
        decode_sparse(good[:-4] + np.float32(np.nan).tobytes(), chunks=2, k=2, chunk_numel=16)


def test_encoding_refuses_what_no_node_could_send():
    with pytest.raises(PayloadError, match="twice"):
        pack([[1, 1]], [[1.0, 2.0]])
    with pytest.raises(PayloadError, match="outside"):
        pack([[1, 16]], [[1.0, 2.0]])
    with pytest.raises(PayloadError, match="values_as"):
        encode_sparse(np.zeros((1, 1), np.int64), np.ones((1, 1), np.float32), 4, values_as="int4")


@pytest.mark.parametrize("values_as", ["2bit", "sign"])
def test_a_part_of_several_tensors_carries_a_scale_for_each(values_as):
    # DeMo packs the chunks of every tensor of one chunk shape as one part: chunks 0-3 one tensor, 4-5 another
    indices, raw = coefficients()
    raw[4:] *= 100.0  # the second tensor's values are far larger: one scale for both would flatten the first
    owners = torch.tensor([0, 0, 0, 0, 1, 1])
    values = d.quantize(raw, values_as, "tensor", owners).numpy()
    for t, rows in enumerate((slice(0, 4), slice(4, 6))):  # each tensor on its own scale, as if alone
        alone = d.quantize(raw[rows], values_as, "tensor").numpy()
        assert np.allclose(values[rows], alone, rtol=1e-6), t
    data = encode_sparse(indices.numpy(), values, 4096, values_as=values_as, segments=(4, 2))
    assert (
        len(data)
        == len(encode_sparse(indices.numpy(), values[:, :], 4096, values_as=values_as, scale="chunk")) - 2 * 4
    )
    got_indices, got_values = decode_sparse(data, chunks=6, k=8, chunk_numel=4096, segments=(4, 2))
    order = np.argsort(indices.numpy(), axis=1)
    assert np.array_equal(got_values, np.take_along_axis(values, order, 1))
