"""One payload format for everything a node writes: safetensors tensors plus a small string header.

A payload is content-addressed (its key is the sha256 of its bytes) and size-bounded. Nothing is
unpickled: safetensors holds raw little-endian arrays and a JSON header. `unpack` checks the digest,
the size, the header's run and schema, and that every value is finite, before anything touches a model.
Readers take plain payloads and compressed frames (`compress.compress`) alike; digests are of stored bytes.
"""

import hashlib
import json

import numpy as np

from ..errors import PayloadError
from .compress import decompress, header_prefix, is_compressed
from .encodings import get_encoding

FORMAT = "slowlink-1"
# How far a compressed payload may expand when the caller gives no max_bytes.
DEFAULT_MAX_BYTES = 1 << 32


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
    entries: dict[str, np.ndarray] = {}
    for name, (_, parts) in encoded.items():
        for suffix, stored in parts.items():
            entries[name + suffix] = np.ascontiguousarray(stored)
    shapes = {name: list(shape) for name, (shape, _) in encoded.items()}
    metadata = {"format": FORMAT, "encoding": encoding, "shapes": json.dumps(shapes, sort_keys=True)}
    metadata.update({key: str(value) for key, value in header.items()})
    return _safetensors_chunks(entries, metadata)


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


def _entry_views(data: bytes) -> dict[str, np.ndarray]:
    """Read-only numpy views of a safetensors file's entries, without copying the bytes.

    safetensors' own loader copies every tensor; a merger holding a contribution would then hold it
    twice. The layout is simple and fully checked here: dtype, shape, and offsets within the buffer.
    """
    length = int.from_bytes(data[:8], "little")
    table = json.loads(data[8 : 8 + length])
    base, size = 8 + length, len(data) - 8 - length
    views = {}
    for name, entry in table.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or entry.get("dtype") not in _DTYPES:
            raise PayloadError(f"payload entry {name!r} has an unsupported dtype {entry!r}")
        dtype = np.dtype(_DTYPES[entry["dtype"]])
        shape, (begin, end) = entry.get("shape"), entry.get("data_offsets", (None, None))
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise PayloadError(f"payload entry {name!r} has a bad shape {shape!r}")
        count = int(np.prod(shape, dtype=np.int64))
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= size):
            raise PayloadError(f"payload entry {name!r} points outside the payload ({begin}, {end})")
        if end - begin != count * dtype.itemsize:
            raise PayloadError(
                f"payload entry {name!r} holds {end - begin} bytes, not {count} {dtype} values"
            )
        views[name] = np.frombuffer(data, dtype=dtype, count=count, offset=base + begin).reshape(shape)
    return views


def read_header(data: bytes) -> dict[str, str]:
    """The string header of a payload, plain or compressed (then only the header is decompressed)."""
    if is_compressed(data):
        data = header_prefix(data, DEFAULT_MAX_BYTES)
    if len(data) < 8:
        raise PayloadError(f"payload of {len(data)} bytes is truncated: it cannot hold a safetensors header")
    length = int.from_bytes(data[:8], "little")
    if length > len(data) - 8:
        raise PayloadError(f"payload header claims {length} bytes but only {len(data) - 8} follow: truncated")
    try:
        header = json.loads(data[8 : 8 + length])
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PayloadError(f"payload header is not JSON: {error}") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise PayloadError(f"payload is not a {FORMAT} payload (its header has no matching 'format')")
    return metadata


def unpack(
    data: bytes,
    *,
    expected_digest: str | None = None,
    expect: dict[str, object] | None = None,
    max_bytes: int | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Check and decode a payload into float32 arrays and its header.

    expected_digest: the sha256 the payload must have (its key). expect: header fields that must match
    (run, schema, ...). max_bytes: the run's size limit, of the stored bytes and of a compressed
    payload once expanded (DEFAULT_MAX_BYTES if None). Raises PayloadError naming the failed check.
    """
    if max_bytes is not None and len(data) > max_bytes:
        raise PayloadError(f"payload of {len(data)} bytes exceeds the run's limit of {max_bytes} bytes")
    if expected_digest is not None and digest(data) != expected_digest:
        raise PayloadError(
            f"payload digest {digest(data)[:16]}… does not match its key {expected_digest[:16]}…"
        )
    if is_compressed(data):
        data = decompress(data, DEFAULT_MAX_BYTES if max_bytes is None else max_bytes)
    header = read_header(data)
    for field, value in (expect or {}).items():
        if header.get(field) != str(value):
            raise PayloadError(f"payload {field} is {header.get(field)!r}, expected {str(value)!r}")
    codec = get_encoding(header.get("encoding", ""))
    try:
        entries = _entry_views(data)
        shapes = json.loads(header["shapes"])
    except (ValueError, TypeError, KeyError) as error:
        raise PayloadError(f"payload tensors cannot be read: {error}") from None
    arrays = {}
    for name, shape in shapes.items():
        parts = {
            key[len(name) :]: value
            for key, value in entries.items()
            if key == name or key.startswith(name + "@")
        }
        try:
            values = codec.decode(parts, tuple(shape))
        except (KeyError, ValueError) as error:
            raise PayloadError(
                f"payload tensor {name!r} cannot be decoded as {header['encoding']}: {error}"
            ) from None
        if not np.isfinite(values).all():
            raise PayloadError(f"payload tensor {name!r} holds NaN or infinite values")
        arrays[name] = values
    return arrays, header
