"""One node's coefficients of one DeMo step on the wire: the packed sparse coefficients (wire/sparse.py) of
each group of tensors with one chunk shape (algorithms/demo.groups_of), in the groups' order, framed with the step they belong to. What every exchange
(torch.distributed, a mailbox, the simulator) carries; a reader refuses a frame of another step or shape.

    header  "SLDS", version, 0, 0, 0, step (u64), parts (u32)      little-endian
    sizes   parts × u32, the bytes of each group's packed coefficients
    parts   each group's packed coefficients, in order
"""

import struct

from ..errors import PayloadError

MAGIC, VERSION = b"SLDS", 2
HEADER = struct.Struct("<4sB3xQI")
SIZE = struct.Struct("<I")


def frame_size(part_sizes: list[int]) -> int:
    """Bytes of a frame of parts of these sizes: with the largest sizes, the most a node can send."""
    return HEADER.size + SIZE.size * len(part_sizes) + sum(part_sizes)


def encode_frame(step: int, parts: list[bytes]) -> bytes:
    sizes = b"".join(SIZE.pack(len(part)) for part in parts)
    return HEADER.pack(MAGIC, VERSION, step, len(parts)) + sizes + b"".join(parts)


def decode_frame(data: bytes, *, step: int, tensors: int) -> list[bytes]:
    """Each tensor's packed coefficients from a peer's frame of `step`; a PayloadError says why not."""
    if len(data) < HEADER.size:
        raise PayloadError(f"{len(data)} bytes: shorter than the {HEADER.size}-byte header of a DeMo step")
    magic, version, sent_step, count = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise PayloadError(f"not a DeMo step of format {VERSION} (magic {magic!r}, version {version})")
    if sent_step != step:
        raise PayloadError(f"coefficients of step {sent_step} where step {step} was expected")
    if count != tensors:
        raise PayloadError(f"{count} parts where the model's tensors make {tensors} groups: the wrong count")
    body = HEADER.size + SIZE.size * count
    if len(data) < body:
        raise PayloadError(f"{len(data)} bytes: too short for the sizes of {count} tensors")
    sizes = [SIZE.unpack_from(data, HEADER.size + SIZE.size * i)[0] for i in range(count)]
    if body + sum(sizes) != len(data):
        raise PayloadError(
            f"{len(data)} bytes where the frame's sizes add up to {body + sum(sizes)}: truncated or padded"
        )
    parts, offset = [], body
    for size in sizes:
        parts.append(data[offset : offset + size])
        offset += size
    return parts
