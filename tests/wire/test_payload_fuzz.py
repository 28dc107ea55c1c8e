"""Payload headers and bytes from a hostile store: real payloads from `payload.pack`, their header JSON
rewritten with drawn values and their bytes cut, flipped and relabelled, plain and compressed. Only
PayloadError may escape `unpack` and `read_header`; what does decode is finite float32 of the shapes
its header names. And `expect_shapes` refuses a tensor of another shape before anything is decoded."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slowlink.errors import PayloadError
from slowlink.wire import payload
from slowlink.wire.compress import MAGIC, compress

zstandard = pytest.importorskip("zstandard")

ARRAYS = {
    "w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
    "b": np.full(5, 0.25, np.float32),
    "s": np.array(2.0, np.float32),
}
SHAPES = {name: values.shape for name, values in ARRAYS.items()}
HONEST = {encoding: payload.pack(ARRAYS, {"run": "r", "kind": "delta"}, encoding=encoding)
          for encoding in ("F32", "BF16", "F8_E4M3", "F4")}  # fmt: skip

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([10**400, 2**63, 2**64 - 1, -1, 0, 1, 32])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["F32", "F4", "U8", "F64", "w", "w@scale", "@", "{}", "[]", '{"w": [3, 4]}'])
)
JSONISH = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10,
)  # fmt: skip
DIMENSIONS = st.integers(0, 6) | st.sampled_from([-1, 2**31, 2**53, 2**62, 10**30, True, 1.5, "3"])
SHAPE = st.lists(DIMENSIONS, max_size=4) | JSONISH

FUZZ = settings(derandomize=True, max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip


def split(data: bytes) -> tuple[dict, bytes]:
    length = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def join(table: dict, body: bytes) -> bytes:
    header = json.dumps(table).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + body


def frame(plain: bytes) -> bytes:
    """`plain` in a zstd frame, unshuffled: a forger need not go through `compress`, which checks it."""
    return MAGIC + zstandard.ZstdCompressor(write_content_size=True, write_checksum=True).compress(plain)


def only_payload_errors(data: bytes) -> None:
    """unpack and read_header raise PayloadError or give what the header names, finite float32."""
    try:
        header = payload.read_header(data)
        assert all(isinstance(value, str) for value in header.values())
    except PayloadError:
        pass
    try:
        arrays, header = payload.unpack(data, max_bytes=1 << 16)
    except PayloadError:
        return
    shapes = json.loads(header["shapes"])
    assert set(arrays) == set(shapes)
    for name, values in arrays.items():
        assert values.dtype == np.float32 and values.shape == tuple(shapes[name])
        assert np.isfinite(values).all()


def shapes_of(metadata: dict) -> dict:
    """The "shapes" object of a header being rewritten, or {} once an earlier rewrite broke it."""
    try:
        shapes = json.loads(metadata["shapes"])
    except (KeyError, TypeError, ValueError, RecursionError):
        return {}
    return shapes if isinstance(shapes, dict) else {}


@st.composite
def rewritten_header(draw) -> bytes:
    """An honest payload whose header JSON has a few fields rewritten: metadata values, "shapes" (its
    object, a tensor's shape, or its JSON text), and entries' dtype, shape and data offsets."""
    table, body = split(HONEST[draw(st.sampled_from(sorted(HONEST)))])
    metadata = table["__metadata__"]
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(["metadata", "shapes", "shape", "shapes-text", "entry", "rename"]))
        if target == "metadata":
            metadata[draw(st.sampled_from(["encoding", "format", "run", "shapes", "extra"]))] = draw(JSONISH)
        elif target == "shapes":
            metadata["shapes"] = json.dumps(draw(JSONISH))
        elif target == "shape":
            shapes = shapes_of(metadata)
            shapes[draw(st.sampled_from(["w", "b", "s", "w@scale", "x"]))] = draw(SHAPE)
            metadata["shapes"] = json.dumps(shapes)
        elif target == "shapes-text":
            levels = draw(st.sampled_from([31, 33, 5000]))
            metadata["shapes"] = "[" * levels + "]" * levels
        elif target == "entry":
            entry = table[draw(st.sampled_from(sorted(name for name in table if name != "__metadata__")))]
            key = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
            entry[key] = draw(SHAPE if key != "dtype" else JSONISH)
        else:  # an entry moved under another name, or a non-entry where one should be
            name = draw(st.sampled_from(sorted(name for name in table if name != "__metadata__")))
            table[draw(st.sampled_from(["w@x", "b@scale", "z", name + "@"]))] = table.pop(name)
    if draw(st.booleans()):
        table[draw(st.sampled_from(["w", "__metadata__", "junk"]))] = draw(JSONISH)
    return join(table, body)


@FUZZ
@given(data=rewritten_header(), compressed=st.booleans())
def test_only_payload_error_escapes_unpack_for_rewritten_headers(data, compressed):
    only_payload_errors(frame(data) if compressed else data)


@FUZZ
@given(
    encoding=st.sampled_from(sorted(HONEST)),
    compressed=st.booleans(),
    cut=st.integers(0, 2000),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), max_size=4),
    length=st.none() | st.integers(0, 2**64 - 1) | st.sampled_from([2**63, 2**32, 7, 0]),
)
def test_only_payload_error_escapes_unpack_for_cut_flipped_and_relabelled_bytes(
    encoding, compressed, cut, flips, length
):
    data = bytearray(compress(HONEST[encoding]) if compressed else HONEST[encoding])
    if length is not None:  # the safetensors header length, or the 8 bytes after the frame marker
        at = len(MAGIC) if compressed else 0
        data[at : at + 8] = length.to_bytes(8, "little")
    for position, bit in flips:
        data[position % len(data)] ^= 1 << bit
    only_payload_errors(bytes(data[: len(data) - cut % len(data)]) if cut else bytes(data))


@pytest.mark.parametrize("compressed", [False, True])
def test_the_honest_payloads_read_back_plain_and_compressed(compressed):
    for data in HONEST.values():
        arrays, header = payload.unpack(compress(data) if compressed else data, expect_shapes=SHAPES)
        assert header["run"] == "r" and {name: values.shape for name, values in arrays.items()} == SHAPES


@pytest.mark.parametrize("compressed", [False, True])
def test_expect_shapes_refuses_an_extra_leading_dimension_before_decoding(compressed):
    # A NaN that decoding would find is not reached: the shape is refused from the header first.
    bad = {"w": np.full((1, 3, 4), np.nan, np.float32), "b": ARRAYS["b"], "s": ARRAYS["s"]}
    encoded = {name: (values.shape, {"": values.reshape(-1)}) for name, values in bad.items()}
    data = payload.pack_encoded(encoded, {"run": "r"}, encoding="F32")
    data = compress(data) if compressed else data
    with pytest.raises(PayloadError, match=r"tensor 'w' has shape \(1, 3, 4\), expected \(3, 4\)"):
        payload.unpack(data, expect_shapes=SHAPES)
    with pytest.raises(PayloadError, match="tensor 'w' holds NaN"):
        payload.unpack(data)


def test_expect_shapes_names_a_missing_or_an_unexpected_tensor():
    data = HONEST["F32"]
    with pytest.raises(PayloadError, match=r"payload lacks tensor 'v' \(expected shape \(2,\)\)"):
        payload.unpack(data, expect_shapes=SHAPES | {"v": (2,)})
    with pytest.raises(
        PayloadError, match="payload holds tensor 's' of shape \\(\\), which the run's schema"
    ):
        payload.unpack(data, expect_shapes={"w": (3, 4), "b": (5,)})


@pytest.mark.parametrize(
    ("length", "rule"),
    [(2**63, "claims 9223372036854775808 bytes"), (2**64 - 1, "truncated"), (3, "not valid JSON")],
)
def test_a_header_length_field_that_lies_raises_payload_error(length, rule):
    data = length.to_bytes(8, "little") + HONEST["F32"][8:]
    with pytest.raises(PayloadError, match=rule):
        payload.unpack(data)
