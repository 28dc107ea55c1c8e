"""sl.TopK as a wire encoding (wire/topk.py): what it keeps of each chunk, its bytes, error feedback's
bookkeeping, its name as the run records it, and bad options or bytes refused."""

import json

import numpy as np
import pytest

import slowlink as sl
from slowlink.wire import payload
from slowlink.wire.encodings import get_encoding
from slowlink.wire.error_feedback import error_feedback_encode
from slowlink.wire.fragment import encode_fragment
from slowlink.wire.topk import parse_topk


def values(shape=(128, 192), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_each_chunk_keeps_its_largest_fraction_on_the_2_bit_grid():
    codec = get_encoding(sl.TopK(fraction=1 / 64, chunk=64).name)
    x = values()
    decoded = codec.decode(codec.encode(x), x.shape)
    for i in range(2):
        for j in range(3):  # six 64×64 chunks, 64 values kept in each: its 64 largest magnitudes
            block, kept = (
                x[64 * i : 64 * i + 64, 64 * j : 64 * j + 64],
                decoded[64 * i : 64 * i + 64, 64 * j : 64 * j + 64],
            )
            assert set(np.flatnonzero(kept)) == set(np.argsort(-np.abs(block).ravel())[:64])
            assert np.all(np.sign(kept[kept != 0]) == np.sign(block[kept != 0]))
    s = np.abs(decoded).max()  # one bf16 scale for the tensor: levels ±s/3, ±s
    ratios = np.unique(np.abs(decoded[decoded != 0])) / s
    assert len(ratios) == 2 and np.allclose(ratios, [1 / 3, 1.0])
    # 6·64 coefficients: header, Rice-coded indices, 2 bits each; against 4 bytes a value in F32
    assert x.nbytes / codec.encode(x)[""].nbytes > 150


def test_error_feedback_sends_over_rounds_what_one_round_leaves_out():
    codec, x = get_encoding(sl.TopK(fraction=1 / 16, chunk=16, values="bf16").name), values((32, 32), 1)
    residual, sent = None, np.zeros_like(x)
    for _ in range(40):
        entries, residual = error_feedback_encode(x, residual, codec)
        sent += codec.decode(entries, x.shape)
        np.testing.assert_allclose(sent + residual, x * (_ + 1), rtol=1e-5, atol=1e-4)  # nothing lost
    assert np.abs(residual).max() < np.abs(x).max() * 16  # bounded: every value goes out in its turn


def test_the_name_is_what_diloco_records_and_what_a_payload_names():
    topk = sl.TopK(fraction=0.02, chunk=32, values="sign", scale="chunk")
    assert parse_topk(topk.name) == topk
    assert sl.DiLoCo(sync_every=5, delta_dtype=topk).to_dict()["delta_dtype"] == topk.name
    assert sl.DiLoCo(sync_every=5, delta_dtype=topk.name).wire().error_feedback  # always on with TopK
    for shape in [(7,), (), (3, 5, 2), (0, 4)]:  # odd shapes: chunk sides are divisors, as DeMo's
        codec, x = get_encoding(topk.name), values(shape, 2)
        assert codec.decode(codec.encode(x), shape).shape == shape


@pytest.mark.parametrize(
    "options, words",
    [({"fraction": 0}, "fraction=0"), ({"fraction": 1.5}, "fraction=1.5"), ({"chunk": 0}, "chunk=0"),
     ({"values": "int3"}, "values='int3'"), ({"scale": "row"}, "scale='row'")],
)  # fmt: skip
def test_bad_options_are_refused_naming_them(options, words):
    with pytest.raises(sl.ConfigError, match=words):
        sl.TopK(**options)


def test_names_and_bytes_that_no_topk_wrote_are_refused():
    with pytest.raises(sl.ConfigError, match="not a TopK"):
        sl.DiLoCo(sync_every=5, delta_dtype="TOPK(fraction=2,chunk=64,values=2bit,scale=tensor)")
    with pytest.raises(sl.PayloadError, match="not a TopK"):
        get_encoding("TOPK(fraction=0.5)")
    codec, x = get_encoding(sl.TopK().name), values()
    data = codec.encode(x)[""]
    with pytest.raises(ValueError, match="wrong count"):
        codec.decode({"": data}, (64, 192))
    with pytest.raises(ValueError, match="truncated"):
        codec.decode({"": data[:-1]}, x.shape)
    with pytest.raises(sl.PayloadError, match="NaN"):
        codec.encode(np.full((4, 4), np.nan, np.float32))


def test_a_payload_holds_every_tensors_bytes_as_one_entry_and_refuses_a_broken_one():
    topk = sl.TopK()
    arrays = {
        f"layer{i}.{part}": values(shape, i)
        for i in range(12)
        for part, shape in (("w", (64, 64)), ("b", (64,)))
    }
    encoded, _ = encode_fragment(arrays, topk.name)
    data = payload.pack_encoded(encoded, {"kind": "delta"}, encoding=topk.name)
    decoded, _ = payload.unpack(data)
    codec = get_encoding(topk.name)
    for name, x in arrays.items():
        assert np.array_equal(decoded[name], codec.decode(codec.encode(x), x.shape))
    length = int.from_bytes(data[:8], "little")
    table = json.loads(data[8 : 8 + length])
    assert set(table) == {"__metadata__", payload.JOINED}
    # what a sparse Δ's payload costs beyond its coefficients: its names and shapes, and a few fixed fields
    coefficients = sum(codec.encode(x)[""].nbytes for x in arrays.values())
    names = len(json.dumps({name: list(x.shape) for name, x in arrays.items()}, separators=(",", ":")))
    assert len(data) - coefficients < names * 1.1 + 250
    first_size = 8 + length  # the joined entry opens with each tensor's size: one changed, the sum is wrong
    broken = data[:first_size] + bytes([data[first_size] ^ 1]) + data[first_size + 1 :]
    with pytest.raises(sl.PayloadError, match="truncated or padded"):
        payload.unpack(broken)
    plain = payload.pack(arrays, {"kind": "delta"})  # a table of entries, one per tensor, relabelled TopK
    length = int.from_bytes(plain[:8], "little")
    table = json.loads(plain[8 : 8 + length])
    table["__metadata__"]["encoding"] = topk.name
    head = json.dumps(table).encode()
    with pytest.raises(sl.PayloadError, match="belongs to no tensor"):
        payload.unpack(len(head).to_bytes(8, "little") + head + plain[8 + length :])


def test_commits_of_topk_deltas_carry_the_quorums_picks_whole():
    # A commit is the mean of the round's sparse Δs, each node's picks its own: the deltas' own TopK would
    # keep a quarter of 4 nodes' picks (and requantize them to 2 bits); the default keeps them all.
    topk = sl.TopK(fraction=1 / 64, chunk=64, values="2bit")
    wire = sl.DiLoCo(sync_every=5, quorum_size=4, delta_dtype=topk).wire()
    assert wire.commit_dtype == sl.TopK(fraction=4 / 64, chunk=64, values="bf16").name
    delta_codec = get_encoding(topk.name)
    mean = sum(delta_codec.decode(delta_codec.encode(values(seed=s)), (128, 192)) for s in range(4)) / 4
    for commit, whole in ((wire.commit_dtype, True), (topk.name, False)):
        codec = get_encoding(commit)
        committed = codec.decode(codec.encode(mean), mean.shape)
        assert np.allclose(committed, mean, rtol=1 / 128, atol=0) == whole  # bf16: 8 bits of mantissa
    # an encoding given is kept, and other deltas' commits default to their own encoding
    assert sl.DiLoCo(sync_every=5, delta_dtype=topk, commit_dtype=topk).wire().commit_dtype == topk.name
    assert sl.DiLoCo(sync_every=5, delta_dtype="F4").wire().commit_dtype == "F4"
