"""Payload framing with every encoding: the header's "encoding" picks the decoder, compressed and plain
payloads read alike, and every check names what failed."""

import json

import numpy as np
import pytest
from safetensors.numpy import save as st_save

from slowlink.errors import PayloadError
from slowlink.wire import payload
from slowlink.wire.compress import compress

ARRAYS = {
    "embed": np.random.default_rng(0).standard_normal((50, 20)).astype(np.float32),
    "bias": np.random.default_rng(1).standard_normal(33).astype(np.float32) * 1e-3,
    "scalar": np.array(0.5, np.float32),
    "empty": np.zeros((0, 4), np.float32),
}
# Largest relative L2 error of any tensor above, and bytes stored for "embed" (1000 values, 32 blocks
# once padded): codes plus 4-byte F32 scales for F8, half-byte codes plus 1-byte E8M0 scales for F4.
EXPECTED = {
    "F32": (0.0, 4000),
    "F16": (3e-4, 2000),
    "BF16": (2e-3, 2000),
    "F8_E4M3": (3e-2, 1024 + 32 * 4),
    "F8_E4M3_TENSOR": (3e-2, 1000 + 4),
    "F4": (0.125, 512 + 32),
}


def stored_bytes(data: bytes, name: str) -> int:
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    return sum(
        e["data_offsets"][1] - e["data_offsets"][0] for k, e in header.items() if k.split("@")[0] == name
    )


@pytest.mark.parametrize("encoding", list(EXPECTED))
def test_each_encoding_packs_and_unpacks_through_the_headers_encoding_field(encoding):
    data = payload.pack(ARRAYS, {"run": "r1", "round": 7}, encoding=encoding)
    arrays, header = payload.unpack(
        data, expected_digest=payload.digest(data), expect={"run": "r1", "round": 7}
    )
    most, embed_bytes = EXPECTED[encoding]
    assert header["encoding"] == encoding and header["round"] == "7"
    assert {name: a.shape for name, a in arrays.items()} == {name: a.shape for name, a in ARRAYS.items()}
    for name, values in ARRAYS.items():
        assert arrays[name].dtype == np.float32
        if values.size:
            assert np.linalg.norm(arrays[name] - values) <= most * np.linalg.norm(values)
    assert stored_bytes(data, "embed") == embed_bytes


@pytest.mark.parametrize("encoding", ["F32", "BF16", "F8_E4M3", "F4"])
def test_compressed_and_plain_payloads_read_alike_and_the_digest_is_of_the_stored_bytes(encoding):
    plain = payload.pack(ARRAYS, {"run": "r1"}, encoding=encoding)
    frame = compress(plain)
    from_plain, _ = payload.unpack(plain)
    from_frame, header = payload.unpack(frame, expected_digest=payload.digest(frame), max_bytes=len(plain))
    assert all(np.array_equal(from_frame[name], from_plain[name]) for name in ARRAYS)
    assert payload.read_header(frame) == payload.read_header(plain) == header
    with pytest.raises(PayloadError, match="does not match its key"):
        payload.unpack(frame, expected_digest=payload.digest(plain))


def test_max_bytes_bounds_a_compressed_payload_once_expanded():
    plain = payload.pack({"z": np.zeros(10_000, np.float32)}, {}, encoding="F32")
    frame = compress(plain)
    assert len(frame) < 1000
    with pytest.raises(PayloadError, match=f"would expand to {len(plain)} bytes, over the limit 20000"):
        payload.unpack(frame, max_bytes=20_000)
    assert payload.unpack(frame, max_bytes=len(plain))[0]["z"].shape == (10_000,)


@pytest.mark.parametrize("encoding", ["F32", "BF16", "F8_E4M3", "F4"])
def test_pack_refuses_non_finite_values_naming_the_tensor(encoding):
    bad = dict(ARRAYS, bias=np.array([1.0, np.nan, np.inf], np.float32))
    with pytest.raises(
        PayloadError, match=f"tensor 'bias' cannot be encoded as {encoding}: 2 values are NaN"
    ):
        payload.pack(bad, {}, encoding=encoding)


def forged(entries: dict[str, np.ndarray], encoding: str, shapes: dict[str, list[int]]) -> bytes:
    metadata = {"format": payload.FORMAT, "encoding": encoding, "shapes": json.dumps(shapes)}
    return st_save(entries, metadata=metadata)


def test_unpack_rejects_payloads_that_decode_to_nan():
    # An E8M0 scale byte of 255 is NaN in MX; the block then decodes to NaN and never reaches a model.
    data = forged({"w": np.full(16, 0x22, np.uint8), "w@scale": np.array([255], np.uint8)}, "F4", {"w": [32]})
    with pytest.raises(PayloadError, match="tensor 'w' holds NaN or infinite values"):
        payload.unpack(data)


def test_unpack_rejects_entries_the_encoding_cannot_decode():
    wrong_dtype = forged(
        {"w": np.zeros(32, np.uint16), "w@scale": np.ones(1, np.float32)}, "F8_E4M3", {"w": [32]}
    )
    with pytest.raises(PayloadError, match="'w' cannot be decoded as F8_E4M3: entry 'main' is uint16"):
        payload.unpack(wrong_dtype)
    missing_scale = forged({"w": np.zeros(32, np.uint8)}, "F8_E4M3", {"w": [32]})
    with pytest.raises(PayloadError, match="'w' cannot be decoded as F8_E4M3"):
        payload.unpack(missing_scale)
    with pytest.raises(PayloadError, match="unknown encoding 'F7'"):
        payload.unpack(forged({"w": np.zeros(32, np.uint8)}, "F7", {"w": [32]}))
    no_encoding = st_save({"w": np.zeros(2, np.float32)}, metadata={"format": payload.FORMAT, "shapes": "{}"})
    with pytest.raises(PayloadError, match="unknown encoding ''"):
        payload.unpack(no_encoding)


def test_unpack_names_the_size_header_and_truncation_checks():
    data = payload.pack(ARRAYS, {"run": "r1"}, encoding="F4")
    with pytest.raises(PayloadError, match="exceeds the run's limit of 100 bytes"):
        payload.unpack(data, max_bytes=100)
    with pytest.raises(PayloadError, match="payload run is 'r1', expected 'r2'"):
        payload.unpack(data, expect={"run": "r2"})
    with pytest.raises(PayloadError, match="truncated"):
        payload.unpack(data[:50])
    with pytest.raises(PayloadError, match="points outside the payload"):
        payload.unpack(data[:-10])


def test_payloads_are_standard_safetensors_files_and_equal_inputs_give_equal_bytes():
    from safetensors.numpy import load

    arrays = {"b": np.arange(5, dtype=np.float32), "a": np.ones((2, 3), np.float32)}
    data = payload.pack(arrays, {"run": "r", "node": "n"}, encoding="F32")
    entries = load(data)  # the reference reader agrees with ours
    np.testing.assert_array_equal(entries["b"], arrays["b"])
    assert data == payload.pack(
        dict(reversed(list(arrays.items()))), {"node": "n", "run": "r"}, encoding="F32"
    )
    decoded, header = payload.unpack(data)
    assert header["node"] == "n" and not decoded["a"].flags.writeable  # a view of the bytes, not a copy
