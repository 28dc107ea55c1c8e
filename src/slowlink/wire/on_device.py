"""Encodings computed where a fragment lives: F32, BF16 and F8_E4M3 of torch tensors on their own device, by
torch's casts, giving exactly the entries of encodings.py for the same values (the refusals too), so a
payload's bytes never depend on where it was encoded. `to_host` brings the encoded entries to host, the only
bytes that cross, into a reused buffer. The other encodings take the host path (fragment.py).

Both casts round to nearest, ties to even, as encodings.py does: BF16 keeps the high half of each float32,
denormals included; E4M3FN codes are taken of values at or under 448 after their block's power-of-two scale,
where the cast cannot reach its NaN code or saturate (tests/wire/test_on_device.py checks every edge).
"""

import numpy as np
import torch

from .encodings import BF16_LIMIT, BLOCK, SCALED_LIMIT, Encoding, largest_magnitude, refuse
from .encodings import CHUNK_BLOCKS as HOST_CHUNK_BLOCKS
from .fragment import HostBuffer
from .minifloat import E4M3

CHUNK_BLOCKS = 1 << 15  # blocks per pass: 4 MiB of float32, so a pass's temporaries stay small


def _flat_f32(values: torch.Tensor) -> torch.Tensor:
    return values.detach().to(torch.float32).contiguous().reshape(-1)


def _entry(entries: dict[str, torch.Tensor], suffix: str, dtype: torch.dtype, size: int) -> torch.Tensor:
    stored = entries[suffix]
    if stored.dtype != dtype or stored.dim() != 1 or stored.shape[0] != size:
        raise ValueError(
            f"entry {suffix or 'main'!r} is {stored.dtype}{list(stored.shape)}, expected {dtype}[{size}]"
        )
    return stored


# ---- F32 and BF16 --------------------------------------------------------------------------------------


def _encode_f32(values: torch.Tensor) -> dict[str, torch.Tensor]:
    flat = _flat_f32(values)
    refuse(largest_magnitude(flat), np.inf, "F32", flat)
    return {"": flat}


def _decode_f32(entries: dict[str, torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
    return _entry(entries, "", torch.float32, int(np.prod(shape))).reshape(shape)


def _refuse_by_chunks(flat: torch.Tensor, largest: float, limit: float, name: str) -> None:
    """Refuse as encodings.py's BF16 and F8_E4M3 do, chunk by chunk: naming the first chunk that holds a
    value refused (its largest magnitude, its values that are not finite), so the message is theirs too."""
    if largest < limit:
        return
    step = HOST_CHUNK_BLOCKS * BLOCK
    for start in range(0, flat.shape[0], step):
        refuse(largest_magnitude(flat[start : start + step]), limit, name, flat[start : start + step])


def _encode_bf16(values: torch.Tensor) -> dict[str, torch.Tensor]:
    flat = _flat_f32(values)
    _refuse_by_chunks(flat, largest_magnitude(flat), BF16_LIMIT, "BF16")
    return {"": flat.to(torch.bfloat16).view(torch.uint16)}  # stored as U16 bits


def _decode_bf16(entries: dict[str, torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
    stored = _entry(entries, "", torch.uint16, int(np.prod(shape)))
    return stored.view(torch.bfloat16).to(torch.float32).reshape(shape)


# ---- F8_E4M3: blocks of 32 values, each with the smallest power-of-two scale that puts it at or under 448 --


def _as_blocks(flat: torch.Tensor) -> torch.Tensor:
    """`flat` as rows of BLOCK values, zero-padded at the end (a view when nothing needs padding)."""
    if flat.shape[0] % BLOCK == 0:
        return flat.view(-1, BLOCK)
    blocks = flat.new_zeros(-(-flat.shape[0] // BLOCK), BLOCK)
    blocks.view(-1)[: flat.shape[0]] = flat
    return blocks


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2**k as float32 for int32 -127 <= k <= 127, built from bits (minifloat.pow2's)."""
    bits = (k + 127) << 23
    return torch.where(k == -127, 0x00400000, bits).view(torch.float32)  # 2**-127 is a float32 denormal


def _scale_exponents(absmax: torch.Tensor) -> torch.Tensor:
    """Smallest k >= -127 with absmax <= 448 * 2**k (minifloat.scale_exponents, for E4M3)."""
    mantissa, exponent = torch.frexp(absmax)  # absmax = mantissa * 2**exponent, mantissa in [0.5, 1)
    top_mantissa, top_exponent = np.frexp(E4M3.max_value)  # 448 = 0.875 * 2**9
    return (exponent - int(top_exponent) + (mantissa > float(top_mantissa)).to(torch.int32)).clamp_min(-127)


def _encode_f8(values: torch.Tensor) -> dict[str, torch.Tensor]:
    flat = _flat_f32(values)
    blocks = _as_blocks(flat)
    absmax = flat.new_empty(blocks.shape[0])
    for start in range(0, blocks.shape[0], CHUNK_BLOCKS):
        torch.amax(
            blocks[start : start + CHUNK_BLOCKS].abs(), dim=1, out=absmax[start : start + CHUNK_BLOCKS]
        )
    _refuse_by_chunks(
        flat, float(absmax.max()) if absmax.shape[0] else 0.0, SCALED_LIMIT, "F8_E4M3"
    )  # NaN too
    k = _scale_exponents(absmax)
    inverse = _pow2(-k)
    codes = torch.empty(blocks.shape, dtype=torch.uint8, device=flat.device)
    for start in range(0, blocks.shape[0], CHUNK_BLOCKS):
        rows = slice(start, start + CHUNK_BLOCKS)
        # values times 2**-k is exact (as encodings.py's); the cast into the codes' memory rounds it
        codes[rows].view(torch.float8_e4m3fn).copy_(blocks[rows] * inverse[rows, None])
    return {"": codes.reshape(-1), "@scale": _pow2(k)}


def _decode_f8(entries: dict[str, torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
    size = int(np.prod(shape))
    blocks = -(-size // BLOCK)
    codes = _entry(entries, "", torch.uint8, blocks * BLOCK).view(blocks, BLOCK)
    scales = _entry(entries, "@scale", torch.float32, blocks)
    if bool(((codes & 0x7F) == 0x7F).any()):
        raise ValueError("holds E4M3 NaN codes (0x7F or 0xFF)")
    # code times scale rounds once, where the product is a float32 denormal, as encodings.py's does
    return (
        (codes.view(torch.float8_e4m3fn).to(torch.float32) * scales[:, None]).view(-1)[:size].reshape(shape)
    )


ENCODINGS: dict[str, Encoding] = {
    "F32": Encoding("F32", _encode_f32, _decode_f32),
    "BF16": Encoding("BF16", _encode_bf16, _decode_bf16),
    "F8_E4M3": Encoding("F8_E4M3", _encode_f8, _decode_f8),
}

ALIGN = 8  # bytes: each entry copied to host starts on a multiple, so every dtype's view of it is aligned
# The host dtypes of the entries above, as payloads store them.
_HOST_DTYPES = {torch.float32: np.float32, torch.uint16: np.uint16, torch.uint8: np.uint8}


def beside(arrays: dict[str, torch.Tensor], other: dict) -> dict[str, torch.Tensor]:
    """`other` (host arrays or tensors) as float32 tensors on the devices of the same-named `arrays`."""
    return {name: torch.as_tensor(other[name], dtype=torch.float32, device=values.device)
            for name, values in arrays.items()}  # fmt: skip


def to_host(encoded: dict[str, tuple[tuple[int, ...], dict[str, torch.Tensor]]], buffer: HostBuffer
            ) -> dict[str, tuple[tuple[int, ...], dict[str, np.ndarray]]]:  # fmt: skip
    """Entries encoded on a device (name -> (shape, suffix -> tensor)) as host arrays: viewed where a tensor
    is in host memory already, else copied into `buffer` (valid until its next use)."""
    if all(stored.device.type == "cpu" for _, entries in encoded.values() for stored in entries.values()):
        return {name: (shape, {suffix: _numpy(stored) for suffix, stored in entries.items()})
                for name, (shape, entries) in encoded.items()}  # fmt: skip
    return copy_to_host(encoded, buffer)


def copy_to_host(encoded: dict[str, tuple[tuple[int, ...], dict[str, torch.Tensor]]], buffer: HostBuffer
                 ) -> dict[str, tuple[tuple[int, ...], dict[str, np.ndarray]]]:  # fmt: skip
    """The entries copied into `buffer`'s memory, grown if they need more (pinned beside a CUDA device, so
    that each copy is one DMA), each at an offset every dtype's view is aligned to."""
    layout, total = [], 0
    for name, (_, entries) in encoded.items():
        for suffix, stored in entries.items():
            size = stored.numel() * stored.element_size()
            layout.append((name, suffix, stored, total, size))
            total += -(-size // ALIGN) * ALIGN
    cuda = {stored.device for _, _, stored, _, _ in layout if stored.device.type == "cuda"}
    pinned = bool(cuda)
    memory = buffer.memory
    if memory is None or memory.shape[0] < total or memory.is_pinned() != pinned:
        memory = buffer.memory = torch.empty(total, dtype=torch.uint8, pin_memory=pinned)
    for _, _, stored, offset, size in layout:
        if size:  # (an empty tensor's strides may not allow a view of another element size)
            memory[offset : offset + size].copy_(stored.reshape(-1).view(torch.uint8), non_blocking=pinned)
    for device in cuda:  # the copies above were queued on each device's stream; the host reads them next
        torch.cuda.synchronize(device)
    host_bytes = memory.numpy()
    host: dict = {name: (shape, {}) for name, (shape, _) in encoded.items()}
    for name, suffix, stored, offset, size in layout:
        host[name][1][suffix] = host_bytes[offset : offset + size].view(_HOST_DTYPES[stored.dtype])
    return host


def _numpy(stored: torch.Tensor) -> np.ndarray:
    if stored.numel() == 0:  # (an empty tensor's strides may not allow a view of another element size)
        return np.empty(0, _HOST_DTYPES[stored.dtype])
    return stored.view(torch.uint8).numpy().view(_HOST_DTYPES[stored.dtype])
