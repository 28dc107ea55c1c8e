"""A quantized all-reduce for tensors of any rank, on any device: each rank quantizes its tensor in blocks of
`block` values, each with its own float32 scale, the ranks all-gather the codes and scales, and each
dequantizes every rank's values and sums them in float32, in rank order (so every rank gets the same bits).

Summing quantized integers instead would overflow 8 (or 4) bits; gathering costs each rank (N − 1) encoded
copies. Codes are symmetric, rounded to nearest: with L = 127 (8 bits) or 7 (4 bits, two codes a byte) and
s = max|x| / L over a block, x̂ = s·round(x / s), so |x − x̂| ≤ s / 2 for every value, and the sum's error is at
most Σ_ranks s_rank / 2 for each block (`error_bound`).
"""

import torch
import torch.distributed as dist

from ..errors import ConfigError

LEVELS = {8: 127, 4: 7}


def _check(bits: int, block: int) -> None:
    if bits not in LEVELS:
        raise ConfigError(f"bits={bits!r} must be 8 or 4 (or None for a float32 all-reduce)")
    if not isinstance(block, int) or block < 2 or block % 2:
        raise ConfigError(f"block={block!r} must be an even integer >= 2: how many values share one scale")


def quantize(tensor: torch.Tensor, bits: int, block: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales): uint8 codes (one a value for 8 bits, two for 4) and one float32 scale per block."""
    _check(bits, block)
    levels = LEVELS[bits]
    flat = tensor.detach().reshape(-1).to(torch.float32)
    padded = torch.nn.functional.pad(flat, (0, (-flat.numel()) % block)).view(-1, block)
    scales = padded.abs().amax(dim=1) / levels
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(padded / safe[:, None]).clamp_(-levels, levels).to(torch.int16) + levels  # 0 … 2L
    codes = codes.to(torch.uint8).view(-1)
    if bits == 4:
        codes = codes[0::2] | (codes[1::2] << 4)
    return codes, scales


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, bits: int, shape: torch.Size, block: int = 256
) -> torch.Tensor:
    """The float32 tensor of `shape` that quantize's (codes, scales) stand for."""
    levels = LEVELS[bits]
    if bits == 4:
        codes = torch.stack([codes & 0xF, codes >> 4], dim=1).view(-1)
    values = (codes.to(torch.float32) - levels).view(-1, block) * scales[:, None]
    return values.view(-1)[: shape.numel()].view(shape)


def error_bound(tensors: list[torch.Tensor], bits: int, block: int = 256) -> torch.Tensor:
    """The bound on |Σ x̂ − Σ x| per value, for these ranks' tensors: Σ_ranks (block's max|x| / L) / 2."""
    total = None
    for tensor in tensors:
        _, scales = quantize(tensor, bits, block)
        total = scales if total is None else total + scales
    return (total / 2).repeat_interleave(block)[: tensors[0].numel()].view(tensors[0].shape)


def all_gather_quantized(tensor: torch.Tensor, bits: int, group=None, block: int = 256) -> list[torch.Tensor]:
    """Every rank's tensor, as its quantized form stands for it, in rank order (this rank's too)."""
    codes, scales = quantize(tensor, bits, block)
    ranks = dist.get_world_size(group)
    all_codes = [torch.empty_like(codes) for _ in range(ranks)]
    all_scales = [torch.empty_like(scales) for _ in range(ranks)]
    dist.all_gather(all_codes, codes, group=group)
    dist.all_gather(all_scales, scales, group=group)
    return [dequantize(c, s, bits, tensor.shape, block) for c, s in zip(all_codes, all_scales, strict=True)]


def quantized_all_reduce(tensor: torch.Tensor, bits: int, group=None, block: int = 256) -> torch.Tensor:
    """Σ over the group's ranks of their tensors, each quantized to `bits` (a new float32 tensor, same shape)."""
    total = None
    for values in all_gather_quantized(tensor, bits, group, block):
        total = values if total is None else total + values
    return total
