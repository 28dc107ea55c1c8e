"""Reusable buffers for DeMo's step (algorithms/demo.py): its large temporaries written in place each step
instead of allocated anew, which touched about 1,500 fresh pages (6 MB) a step, as costly as the transform.
"""

import torch


class Scratch:
    """One group's buffers (its stack of chunks, the products, |coefficients|, the dense average and its
    counts), made at the first step and written over at every later one. A result that lives here is valid
    until the next call given the same scratch."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def buffer(self, role: str, shape, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The buffer for `role`: `shape`, on like's device, in `dtype` or like's (made anew when they change)."""
        shape, dtype, held = tuple(shape), dtype or like.dtype, self._buffers.get(role)
        if held is None or held.shape != shape or held.dtype != dtype or held.device != like.device:
            held = self._buffers[role] = torch.empty(shape, dtype=dtype, device=like.device)
        return held


Scratches = tuple[Scratch, ...] | None  # one Scratch per group, in the groups' order
