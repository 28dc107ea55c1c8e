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
        self._written: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # role: (buffer, columns written)

    def buffer(self, role: str, shape, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The buffer for `role`: `shape`, on like's device, in `dtype` or like's (made anew when they change)."""
        shape, dtype, held = tuple(shape), dtype or like.dtype, self._buffers.get(role)
        if held is None or held.shape != shape or held.dtype != dtype or held.device != like.device:
            held = self._buffers[role] = torch.empty(shape, dtype=dtype, device=like.device)
        return held

    def zeros(self, role: str, shape, like: torch.Tensor, at: torch.Tensor, dtype: torch.dtype | None = None):
        """The buffer for `role`, all zeros, for a caller that writes only at the columns `at` of each row
        (indices along dim 1, as scatter takes them). A buffer written so before is cleared only where it
        was, not whole: a sparse average touches a few percent of its dense buffer."""
        held = self.buffer(role, shape, like, dtype)
        last = self._written.get(role)
        if last is not None and last[0] is held:
            held.scatter_(1, last[1], 0)
        else:
            held.zero_()
        self._written[role] = (held, at)
        return held


Scratches = tuple[Scratch, ...] | None  # one Scratch per group, in the groups' order
