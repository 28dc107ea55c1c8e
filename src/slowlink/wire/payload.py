"""One payload format for everything a node writes: safetensors tensors plus a small string header.

A payload is content-addressed (its key is the sha256 of its bytes) and size-bounded. Nothing is
unpickled: safetensors holds raw little-endian arrays and a JSON header. `unpack` checks the digest,
the size, every field of the header (bounded JSON, typed, shapes that cannot overflow), its run and
schema, the tensors' names and shapes, and that every value is finite, before anything touches a model;
whatever the bytes, it fails with PayloadError alone.
Readers take plain payloads and compressed frames (`compress.compress`) alike; digests are of stored bytes.
"""

import hashlib
import json
import math

import numpy as np

from ..errors import PayloadError
from . import bounded_json
from .bounded_json import brief
from .compress import MAX_HEADER_BYTES, decompress, header_prefix, is_compressed
from .encodings import get_encoding

FORMAT = "slowlink-1"
# How far a compressed payload may expand when the caller gives no max_bytes.
DEFAULT_MAX_BYTES = 1 << 32
MAX_DIMS = 32  # numpy 1's limit; no model has a tensor of more dimensions
# Values in one tensor: 2**53 - 1 keeps every byte count (≤ 8 bytes a value) within int64, so numpy
# never wraps, and every count exact as a float64.
MAX_ELEMENTS = 2**53 - 1
# The one entry of a joined encoding's payload (Encoding.joined: sl.TopK's): every tensor's bytes.
JOINED = "@joined"
_NOTHING = np.zeros(0, np.uint8)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack(arrays: dict[str, np.ndarray], header: dict[str, object], *, encoding: str = "F32") -> bytes:
    """Encode float32 `arrays` with `encoding` and frame them with `header` (values become strings)."""
    return b"".join(_frame(encode_arrays(arrays, encoding), header, encoding))


def pack_encoded(encoded: dict[str, tuple[tuple[int, ...], dict[str, np.ndarray]]], header: dict[str, object],
                 *, encoding: str) -> bytes:  # fmt: skip
    """Frame tensors already encoded with `encoding`: name -> (shape, the codec's entries)."""
    return b"".join(_frame(encoded, header, encoding))


def digest_of(arrays: dict[str, np.ndarray], header: dict[str, object], *, encoding: str = "F32") -> str:
    """The digest `pack` would give, without building the payload: how a node checks parameters it rebuilt."""
    hasher = hashlib.sha256()
    for chunk in _frame(encode_arrays(arrays, encoding), header, encoding):
        hasher.update(chunk)
    return hasher.hexdigest()


def encode_arrays(arrays: dict[str, np.ndarray], encoding: str) -> dict[str, tuple[tuple[int, ...], dict]]:
    codec = get_encoding(encoding)
    encoded = {}
    for name, values in arrays.items():
        try:
            encoded[name] = (values.shape, codec.encode(values))
        except PayloadError as error:
            raise PayloadError(f"tensor {name!r} cannot be encoded as {encoding}: {error}") from None
    return encoded


def _frame(
    encoded: dict[str, tuple[tuple[int, ...], dict]], header: dict[str, object], encoding: str
) -> list:
    entries = {JOINED: _join(encoded)} if get_encoding(encoding).joined else _entries(encoded)
    shapes = {name: list(shape) for name, (shape, _) in encoded.items()}
    # A joined payload's names and shapes outweigh its table: they are written without spaces.
    separators = (",", ":") if JOINED in entries else None
    metadata = {"format": FORMAT, "encoding": encoding,
                "shapes": json.dumps(shapes, sort_keys=True, separators=separators)}  # fmt: skip
    metadata.update({key: str(value) for key, value in header.items()})
    return _safetensors_chunks(entries, metadata)


def _entries(encoded: dict[str, tuple[tuple[int, ...], dict]]) -> dict[str, np.ndarray]:
    entries: dict[str, np.ndarray] = {}
    for name, (_, parts) in encoded.items():
        for suffix, stored in parts.items():
            if name + suffix in entries:  # e.g. tensors "w" and "w@scale" in F8_E4M3
                raise PayloadError(
                    f"tensor names collide in a payload: {name + suffix!r} would hold two tensors' entries; "
                    "rename one so that no name is another's followed by '@'"
                )
            entries[name + suffix] = np.ascontiguousarray(stored)
    return entries


def _join(encoded: dict[str, tuple[tuple[int, ...], dict]]) -> np.ndarray:
    """The one entry of a joined encoding: each tensor's bytes, in name order, after their sizes (LEB128)."""
    parts = []
    for name in sorted(encoded):
        entries = encoded[name][1]
        if set(entries) != {""} or entries[""].dtype != np.uint8:
            raise PayloadError(
                f"tensor {name!r}: a joined encoding gives one entry of bytes, not {sorted(entries)}"
            )
        parts.append(entries[""].ravel())
    sizes = bytearray()
    for part in parts:
        size = part.size
        while size >= 0x80:
            sizes.append(size & 0x7F | 0x80)
            size >>= 7
        sizes.append(size)
    return np.concatenate([np.frombuffer(bytes(sizes), np.uint8), *parts])


def _split(joined: np.ndarray, names: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """Each tensor's entry from a joined entry (`_join`'s), or PayloadError."""
    if joined.dtype != np.uint8 or joined.ndim != 1:
        raise PayloadError(f"the joined entry is {joined.dtype}{list(joined.shape)}, not bytes")
    sizes, at = [], 0
    for name in names:
        size, shift = 0, 0
        while True:
            if at >= joined.size or shift > 56:
                raise PayloadError(f"the joined entry is truncated in the size of tensor {brief(name)}")
            byte = int(joined[at])
            size, shift, at = size | (byte & 0x7F) << shift, shift + 7, at + 1
            if byte < 0x80:
                break
        sizes.append(size)
    if at + sum(sizes) != joined.size:
        raise PayloadError(f"the joined entry holds {joined.size - at} bytes of tensors whose sizes add up to "
                           f"{sum(sizes)}: truncated or padded")  # fmt: skip
    parts = {}
    for name, size in zip(names, sizes, strict=True):
        parts[name], at = {"": joined[at : at + size]}, at + size
    return parts


_CODES = {np.dtype(code): name for name, code in {
    "F32": "<f4", "F16": "<f2", "U8": "u1", "U16": "<u2", "I8": "i1", "I16": "<i2", "I32": "<i4", "U32": "<u4"}.items()}  # fmt: skip


def _safetensors_chunks(entries: dict[str, np.ndarray], metadata: dict[str, str]) -> list:
    """The pieces of a safetensors file, a header in sorted order then each array's bytes, uncopied.

    safetensors' own writer copies every tensor twice (tobytes, then the output) and orders the metadata
    at random, so equal payloads from two processes would differ; this one is deterministic.
    """
    table: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name in sorted(entries):
        array = entries[name]
        if array.dtype not in _CODES:
            raise PayloadError(f"payload entry {name!r} has dtype {array.dtype}, which payloads do not store")
        table[name] = {"dtype": _CODES[array.dtype], "shape": list(array.shape),
                       "data_offsets": [offset, offset + array.nbytes]}  # fmt: skip
        offset += array.nbytes
    header = json.dumps(table, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # align the data to 8 bytes, as safetensors does
    arrays = [memoryview(entries[name]).cast("B") for name in sorted(entries)]
    return [len(header).to_bytes(8, "little"), header, *arrays]


# safetensors dtype codes of the entries encodings store, as little-endian numpy dtypes.
_DTYPES = {name: code.str for code, name in _CODES.items()}


def check_shape(shape: object, what: str) -> tuple[int, ...]:
    """`shape` as a tuple, if it is a list of at most MAX_DIMS integers ≥ 0 whose product is at most
    MAX_ELEMENTS; else PayloadError naming `what`. Products are exact Python ints: no int64 wraps."""
    if not (
        isinstance(shape, list)
        and len(shape) <= MAX_DIMS
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        and math.prod(shape) <= MAX_ELEMENTS
    ):
        raise PayloadError(
            f"{what} has the shape {brief(shape)}, not a list of at most {MAX_DIMS} dimensions ≥ 0 "
            f"holding at most 2**53 - 1 values"
        )
    return tuple(shape)


def _read_table(data: bytes) -> tuple[dict[str, str], dict[str, object], int]:
    """(metadata, entries, where the data begins) of a safetensors header, each checked for its type."""
    if len(data) < 8:
        raise PayloadError(f"payload of {len(data)} bytes is truncated: it cannot hold a safetensors header")
    length = int.from_bytes(data[:8], "little")
    if length > len(data) - 8:
        raise PayloadError(f"payload header claims {length} bytes but only {len(data) - 8} follow: truncated")
    if length > MAX_HEADER_BYTES:
        raise PayloadError(f"payload header of {length} bytes is over the {MAX_HEADER_BYTES}-byte limit")
    table = bounded_json.loads(bytes(data[8 : 8 + length]), what="payload header", max_bytes=MAX_HEADER_BYTES)
    metadata = table.pop("__metadata__", None) if isinstance(table, dict) else None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise PayloadError(f"payload is not a {FORMAT} payload (its header has no matching 'format')")
    for field, value in metadata.items():
        if not isinstance(value, str):
            raise PayloadError(f"payload header field {brief(field)} is {brief(value)}, not a string")
    return metadata, table, 8 + length


def read_header(data: bytes) -> dict[str, str]:
    """The string header of a payload, plain or compressed (then only the header is decompressed)."""
    if is_compressed(data):
        data = header_prefix(data, DEFAULT_MAX_BYTES)
    return _read_table(data)[0]


def _tensor_shapes(metadata: dict[str, str]) -> dict[str, tuple[int, ...]]:
    """The header's "shapes": a JSON object of tensor name -> shape."""
    if "shapes" not in metadata:
        raise PayloadError("payload header lacks the field 'shapes' (tensor name -> shape)")
    shapes = bounded_json.loads(metadata["shapes"], what="payload field 'shapes'", max_bytes=MAX_HEADER_BYTES)
    if not isinstance(shapes, dict):
        raise PayloadError(f"payload field 'shapes' is {brief(shapes)}, not a JSON object of name -> shape")
    return {name: check_shape(shape, f"payload tensor {brief(name)}") for name, shape in shapes.items()}


def _check_expected(shapes: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]]) -> None:
    """Exactly the `expected` tensors with their shapes, or PayloadError naming the first that differs."""
    extra, missing = sorted(shapes.keys() - expected.keys()), sorted(expected.keys() - shapes.keys())
    if extra:
        raise PayloadError(f"payload holds tensor {brief(extra[0])} of shape {shapes[extra[0]]}, "
                           "which the run's schema does not have here")  # fmt: skip
    if missing:
        raise PayloadError(
            f"payload lacks tensor {missing[0]!r} (expected shape {tuple(expected[missing[0]])})"
        )
    for name, shape in sorted(shapes.items()):
        if shape != tuple(expected[name]):
            raise PayloadError(f"payload tensor {name!r} has shape {shape}, expected {tuple(expected[name])}")


def _owner(entry: str, shapes: dict[str, tuple[int, ...]]) -> str:
    """The tensor an entry belongs to: the entry's name is the tensor's, or the tensor's then "@" and a
    suffix without "@" (what encodings store beside the main entry, e.g. "@scale")."""
    head, at, _ = entry.rpartition("@")
    owners = [name for name in (entry, head if at else None) if name in shapes]
    if not owners:
        raise PayloadError(f"payload entry {brief(entry)} belongs to no tensor in its header's 'shapes'")
    if len(owners) > 1:
        raise PayloadError(
            f"payload entry {brief(entry)} belongs to tensors {brief(owners)}: their names collide"
        )
    return owners[0]


def _entry_views(
    data: bytes, table: dict[str, object], base: int, shapes: dict[str, tuple[int, ...]]
) -> dict[str, dict[str, np.ndarray]]:
    """Read-only numpy views of a safetensors file's entries, by tensor then suffix, without copying.

    safetensors' own loader copies every tensor; a merger holding a contribution would then hold it
    twice. The layout is simple and fully checked here: dtype, shape, and offsets within the buffer.
    """
    size = len(data) - base
    views: dict[str, dict[str, np.ndarray]] = {name: {} for name in shapes}
    for name, entry in table.items():
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if not (isinstance(dtype, str) and dtype in _DTYPES):
            raise PayloadError(f"payload entry {brief(name)} has an unsupported dtype: {brief(entry)}")
        dtype = np.dtype(_DTYPES[dtype])
        shape = check_shape(entry.get("shape"), f"payload entry {brief(name)}")
        offsets = entry.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)
                and 0 <= offsets[0] <= offsets[1] <= size):  # fmt: skip
            raise PayloadError(f"payload entry {brief(name)} points outside the payload: {brief(offsets)}")
        begin, end = offsets
        count = math.prod(shape)
        if end - begin != count * dtype.itemsize:
            raise PayloadError(
                f"payload entry {brief(name)} holds {end - begin} bytes, not {count} {dtype} values"
            )
        owner = _owner(name, shapes)
        views[owner][name[len(owner) :]] = np.frombuffer(
            data, dtype=dtype, count=count, offset=base + begin
        ).reshape(shape)
    return views


def unpack(
    data: bytes,
    *,
    expected_digest: str | None = None,
    expect: dict[str, object] | None = None,
    max_bytes: int | None = None,
    expect_shapes: dict[str, tuple[int, ...]] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Check and decode a payload into float32 arrays and its header.

    expected_digest: the sha256 the payload must have (its key). expect: header fields that must match
    (run, schema, ...). max_bytes: the run's size limit, of the stored bytes and of a compressed
    payload once expanded (DEFAULT_MAX_BYTES if None). expect_shapes: exactly the tensors, by name, and
    their shapes the payload must hold, checked from its header before anything is decoded.
    Raises PayloadError naming the failed check, whatever the bytes.
    """
    if max_bytes is not None and len(data) > max_bytes:
        raise PayloadError(f"payload of {len(data)} bytes exceeds the run's limit of {max_bytes} bytes")
    if expected_digest is not None and digest(data) != expected_digest:
        raise PayloadError(
            f"payload digest {digest(data)[:16]}… does not match its key {str(expected_digest)[:16]}…"
        )
    if is_compressed(data):
        data = decompress(data, DEFAULT_MAX_BYTES if max_bytes is None else max_bytes)
    header, table, base = _read_table(data)
    for field, value in (expect or {}).items():
        if header.get(field) != str(value):
            raise PayloadError(f"payload {field} is {brief(header.get(field))}, expected {str(value)!r}")
    codec = get_encoding(header.get("encoding", ""))
    shapes = _tensor_shapes(header)
    if expect_shapes is not None:
        _check_expected(shapes, expect_shapes)
    if codec.joined:
        joined = _entry_views(data, table, base, {JOINED: ()})[JOINED].get("", _NOTHING)
        entries = _split(joined, sorted(shapes))
    else:
        entries = _entry_views(data, table, base, shapes)
    arrays = {}
    for name, shape in shapes.items():
        try:
            values = codec.decode(entries[name], shape)
        except KeyError as error:
            raise PayloadError(f"payload tensor {brief(name)} cannot be decoded as {codec.name}: it lacks the "
                               f"entry {brief(name + str(error.args[0]))}") from None  # fmt: skip
        except ValueError as error:
            raise PayloadError(
                f"payload tensor {brief(name)} cannot be decoded as {codec.name}: {error}"
            ) from None
        if not np.isfinite(values).all():
            raise PayloadError(f"payload tensor {brief(name)} holds NaN or infinite values")
        arrays[name] = values
    return arrays, header
