"""Byte-shuffled zstandard framing of payloads: fewer bytes in the store, the same payload after reading.

`compress` groups the i-th byte of every element of each tensor together (sign and exponent bytes
repeat far more than low mantissa bytes), leaves the safetensors header as it is, and compresses the
whole with zstandard; `decompress` undoes it within a size bound. zstandard is an optional extra
(`pip install slowlink[zstd]`), imported only when a payload is compressed or read.

Frame: MAGIC (8 bytes) | one zstd frame, with content size and checksum, of the plain payload whose
tensor data is byte-shuffled. MAGIC read as a safetensors header length is far beyond any real size,
so no plain payload starts with it.
"""

from types import ModuleType
from typing import BinaryIO

import numpy as np

from ..errors import ConfigError, PayloadError
from . import bounded_json

MAGIC = b"SLZSTD1\n"
DEFAULT_LEVEL = 3
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on its JSON header; payload.py's too
# Bytes of each safetensors dtype's element; the shuffle groups bytes by their place in an element.
ELEMENT_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip


def _zstd() -> ModuleType:
    try:
        import zstandard
    except ImportError:
        raise ConfigError(
            "compression='zstd' needs the zstandard package, which is not installed: "
            "pip install slowlink[zstd]"
        ) from None
    return zstandard


def is_compressed(data: bytes) -> bool:
    return bytes(data[: len(MAGIC)]) == MAGIC


def _layout(payload: bytes) -> tuple[int, list[tuple[int, int, int]]]:
    """End of a safetensors payload's header, and (begin, end, element bytes) of each tensor's data."""
    if len(payload) < 8:
        raise PayloadError(f"payload of {len(payload)} bytes is truncated: it cannot hold a header")
    header_end = 8 + int.from_bytes(payload[:8], "little")
    if header_end > len(payload):
        raise PayloadError(f"payload header claims {header_end - 8} bytes but {len(payload) - 8} follow")
    try:
        header = bounded_json.loads(bytes(payload[8:header_end]), what="it", max_bytes=MAX_HEADER_BYTES)
    except PayloadError as error:
        raise PayloadError(f"payload header is not a safetensors header: {error}") from None
    if not isinstance(header, dict):
        raise PayloadError("payload header is not a safetensors header: it is not a JSON object")
    return header_end, [
        _tensor_range(name, entry) for name, entry in header.items() if name != "__metadata__"
    ]


def _tensor_range(name: str, entry: object) -> tuple[int, int, int]:
    dtype = entry.get("dtype") if isinstance(entry, dict) else None
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if not (isinstance(dtype, str) and dtype in ELEMENT_BYTES and isinstance(offsets, list) and len(offsets) == 2
            and all(type(n) is int for n in offsets) and 0 <= offsets[0] <= offsets[1]
            and (offsets[1] - offsets[0]) % ELEMENT_BYTES[dtype] == 0):  # fmt: skip
        raise PayloadError(
            f"payload header is not a safetensors header: entry {bounded_json.brief(name)} is not a dtype with data "
            "offsets [begin, end] of whole elements"
        )
    return offsets[0], offsets[1], ELEMENT_BYTES[dtype]


def _shuffle(
    payload: bytes, header_end: int, tensors: list[tuple[int, int, int]], *, inverse: bool = False
) -> bytes:
    """`payload` with each tensor's bytes grouped by their place in an element (`inverse`: ungrouped)."""
    plain = np.frombuffer(payload, np.uint8)
    out = plain.copy()  # the header, and 1-byte elements, stay as they are
    for begin, end, size in tensors:
        if size > 1 and end > begin:
            source, target = (
                plain[header_end + begin : header_end + end],
                out[header_end + begin : header_end + end],
            )
            if inverse:
                target.reshape(-1, size)[...] = source.reshape(size, -1).T
            else:
                target.reshape(size, -1)[...] = source.reshape(-1, size).T
    return out.tobytes()


def compress(payload: bytes, level: int = DEFAULT_LEVEL) -> bytes:
    """A compressed frame holding `payload` (a safetensors payload); `decompress` gives it back."""
    zstandard = _zstd()
    header_end, tensors = _layout(payload)
    _check_size(payload, header_end, tensors)
    shuffled = _shuffle(payload, header_end, tensors)
    compressor = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    return MAGIC + compressor.compress(shuffled)


def _check_size(payload: bytes, header_end: int, tensors: list[tuple[int, int, int]]) -> None:
    data_size = max((end for _, end, _ in tensors), default=0)
    if header_end + data_size != len(payload):
        raise PayloadError(f"payload holds {len(payload) - header_end} data bytes, its header {data_size}")


def _declared_size(body: bytes, max_bytes: int) -> int:
    zstandard = _zstd()
    try:
        size = zstandard.frame_content_size(body)
    except zstandard.ZstdError as error:
        raise PayloadError(f"compressed payload has no valid zstd frame header: {error}") from None
    if size < 0:
        raise PayloadError("compressed payload does not declare its size")
    if size > max_bytes:
        raise PayloadError(f"compressed payload would expand to {size} bytes, over the limit {max_bytes}")
    return size


def decompress(data: bytes, max_bytes: int) -> bytes:
    """The payload inside a compressed frame, refusing (PayloadError) any that would exceed `max_bytes`.

    The frame declares its size, checked before anything is decompressed; zstd then holds it to it.
    """
    if not is_compressed(data):
        raise PayloadError("data is not a compressed payload (no zstd frame marker)")
    zstandard = _zstd()
    body = data[len(MAGIC) :]
    size = _declared_size(body, max_bytes)
    try:
        shuffled = zstandard.ZstdDecompressor().decompress(body, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as error:
        raise PayloadError(f"compressed payload is corrupt or truncated: {error}") from None
    if len(shuffled) != size:  # zstandard returns b"" for an empty frame without reading on
        raise PayloadError(f"compressed payload holds {len(shuffled)} bytes, not the {size} it declares")
    header_end, tensors = _layout(shuffled)
    _check_size(shuffled, header_end, tensors)
    return _shuffle(shuffled, header_end, tensors, inverse=True)


def header_prefix(data: bytes, max_bytes: int) -> bytes:
    """The 8-byte length and JSON header of a compressed payload, decompressing nothing beyond them."""
    zstandard = _zstd()
    body = data[len(MAGIC) :]
    size = _declared_size(body, max_bytes)
    try:
        with zstandard.ZstdDecompressor().stream_reader(body) as reader:
            prefix = _read_exactly(reader, min(8, size))
            length = int.from_bytes(prefix, "little")
            if len(prefix) < 8 or 8 + length > size:
                raise PayloadError(f"compressed payload's header claims {length} bytes of its {size}")
            return prefix + _read_exactly(reader, length)
    except zstandard.ZstdError as error:
        raise PayloadError(f"compressed payload is corrupt or truncated: {error}") from None


def _read_exactly(reader: BinaryIO, size: int) -> bytes:
    parts, missing = [], size
    while missing:
        part = reader.read(missing)
        if not part:
            raise PayloadError(f"compressed payload ends {missing} bytes early")
        parts.append(part)
        missing -= len(part)
    return b"".join(parts)
