"""Byte-shuffled zstandard framing of payloads: fewer bytes in the store, the same payload after reading.

`compress` groups the i-th byte of every element of each tensor together (sign and exponent bytes
repeat far more than low mantissa bytes), leaves the safetensors header as it is, and compresses the
whole with zstandard; `decompress` undoes it within a size bound. zstandard is an optional extra
(`pip install slowlink[zstd]`), imported only when a payload is compressed or read.

Frame: MAGIC (8 bytes) | one zstd frame, with content size and checksum, of the plain payload whose
tensor data is byte-shuffled. MAGIC read as a safetensors header length is far beyond any real size,
so no plain payload starts with it.
"""

import io
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


STREAM_BYTES = 1 << 20  # bytes of a frame fed to zstd at a time, when decompressing


def _regions(header_end: int, tensors: list[tuple[int, int, int]], size: int) -> list[tuple[int, int, int]]:
    """(begin, end, element bytes) of the payload's consecutive parts, in order: the header and any bytes
    between tensors with element size 1 (kept as they are), each tensor's data with its own. PayloadError
    if two tensors' data overlap: no payload `pack` writes has them, and a shuffle could not undo them."""
    regions, position = [], 0
    for begin, end, element in sorted((header_end + b, header_end + e, n) for b, e, n in tensors if e > b):
        if begin < position:
            raise PayloadError("payload header is not a safetensors header: two entries' data overlap")
        regions += [(position, begin, 1)] if begin > position else []
        regions.append((begin, end, element))
        position = end
    return regions + ([(position, size, 1)] if size > position else [])


def _shuffled(payload: bytes, regions: list[tuple[int, int, int]]):
    """The payload with each tensor's bytes grouped by their place in an element: byte 0 of every
    element, then byte 1, ... (the header and 1-byte elements as they are), in pieces of at most
    STREAM_BYTES, each a new array: never a whole shuffled copy."""
    plain = np.frombuffer(payload, np.uint8)
    for begin, end, element in regions:
        rows = plain[begin:end].reshape(-1, element)
        for place in range(element):
            for start in range(0, rows.shape[0], STREAM_BYTES):
                yield np.ascontiguousarray(rows[start : start + STREAM_BYTES, place])


class _Unshuffler:
    """Writes the bytes of a shuffled payload, given in order and in pieces of any size, unshuffled into
    `out` (the payload's declared size): the header as it is, then each region's bytes where they belong."""

    def __init__(self, out: np.ndarray) -> None:
        self.out, self.written = out, 0
        self.regions: list[tuple[int, int, int]] | None = None  # known once the header is in

    def write(self, piece: bytes) -> None:
        data = np.frombuffer(piece, np.uint8)
        while len(data):
            taken = self._header(data) if self.regions is None else self._place(data)
            data = data[taken:]

    def _header(self, data: np.ndarray) -> int:
        need = 8 if self.written < 8 else 8 + int.from_bytes(self.out[:8], "little")
        taken = min(len(data), need - self.written)
        self.out[self.written : self.written + taken] = data[:taken]
        self.written += taken
        if self.written >= 8:
            need = 8 + int.from_bytes(self.out[:8], "little")
            if need > len(self.out):
                raise PayloadError(
                    f"compressed payload's header claims {need - 8} bytes of its {len(self.out)}"
                )
            if self.written == need:
                header_end, tensors = _layout(self.out)
                _check_size(self.out, header_end, tensors)
                self.regions = [r for r in _regions(header_end, tensors, len(self.out)) if r[1] > need]
        return taken

    def _place(self, data: np.ndarray) -> int:
        if not self.regions:
            raise PayloadError("compressed payload holds more bytes than it declares")
        begin, end, element = self.regions[0]
        elements = (end - begin) // element
        place, index = divmod(self.written - begin, elements)  # planes come one after the other
        taken = min(len(data), elements - index)
        self.out[begin:end].reshape(elements, element)[index : index + taken, place] = data[:taken]
        self.written += taken
        if self.written == end:
            self.regions.pop(0)
        return taken


def compress(payload: bytes, level: int = DEFAULT_LEVEL) -> bytes:
    """A compressed frame holding `payload` (a safetensors payload); `decompress` gives it back.

    The shuffled payload goes to zstd in pieces, told its whole size first (so that the frame is within
    0.2% of a one-shot one's): besides the payload and the frame, one piece is all this holds."""
    zstandard = _zstd()
    header_end, tensors = _layout(payload)
    _check_size(payload, header_end, tensors)
    compressor = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    stream, frame = compressor.compressobj(size=len(payload)), io.BytesIO()
    frame.write(MAGIC)
    for piece in _shuffled(payload, _regions(header_end, tensors, len(payload))):
        frame.write(stream.compress(piece))
    frame.write(stream.flush())
    return frame.getvalue()  # (its own buffer, not a copy: nothing else has seen it)


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


def decompress(data: bytes, max_bytes: int) -> memoryview:
    """The payload inside a compressed frame (read-only), refusing (PayloadError) any that would exceed
    `max_bytes`.

    The frame declares its size, checked before anything is decompressed; zstd then holds it to it. The
    frame is fed to zstd in pieces and each piece of output is unshuffled straight into the payload's
    buffer, so that besides the frame and the payload, a piece is all this holds."""
    if not is_compressed(data):
        raise PayloadError("data is not a compressed payload (no zstd frame marker)")
    zstandard = _zstd()
    body = memoryview(data)[len(MAGIC) :]
    size = _declared_size(body, max_bytes)
    out = np.empty(size, np.uint8)
    sink, stream = _Unshuffler(out), zstandard.ZstdDecompressor().decompressobj()
    try:
        for start in range(0, len(body), STREAM_BYTES):
            if stream.eof:
                raise PayloadError("compressed payload has unused data after its zstd frame")
            sink.write(stream.decompress(body[start : start + STREAM_BYTES]))
    except zstandard.ZstdError as error:
        raise PayloadError(f"compressed payload is corrupt or truncated: {error}") from None
    if stream.unused_data:
        raise PayloadError("compressed payload has unused data after its zstd frame")
    if not stream.eof or sink.written != size:
        raise PayloadError(f"compressed payload holds {sink.written} bytes, not the {size} it declares")
    out.flags.writeable = False
    return memoryview(out)


def header_prefix(data: bytes, max_bytes: int) -> bytes:
    """The 8-byte length and JSON header of a compressed payload, decompressing nothing beyond them."""
    zstandard = _zstd()
    body = memoryview(data)[len(MAGIC) :]
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
