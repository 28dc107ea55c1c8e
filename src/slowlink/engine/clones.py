"""Where a node clones its snapshots: flat float32 buffers on the tensors' devices, `in_flight` of them made
and touched once at the start, any fragment's tensors laid out as views at a buffer's front, so a sync step
copies into held memory and never allocates (fresh memory costs a page fault per page on a CPU, allocator
traffic on a GPU)."""

import math
from collections.abc import Callable

import torch


class ClonePool:
    """Buffers for up to `count` snapshots at once; `take` lays a fragment out in a free one, `release` frees
    the one a fragment holds (once nothing reads its snapshot: engine/channel.py)."""

    def __init__(self, tensors: dict, plan: list[list[str]], count: int) -> None:
        self.layouts = [[(name, tensors[name].device, tuple(tensors[name].shape)) for name in names]
                        for names in plan]  # fmt: skip
        self.shapes = {name: (device, shape) for layout in self.layouts for name, device, shape in layout}
        # Per device, the most elements one fragment holds there: every fragment fits every buffer.
        self.sizes: dict[torch.device, int] = {}
        for layout in self.layouts:
            held: dict[torch.device, int] = {}
            for _, device, shape in layout:
                held[device] = held.get(device, 0) + math.prod(shape)
            for device, size in held.items():
                self.sizes[device] = max(self.sizes.get(device, 0), size)
        self.count = max(1, count)
        self.free = [self._buffers() for _ in range(self.count)]
        self.held: dict[int, dict[torch.device, torch.Tensor]] = {}  # fragment -> the buffers it holds

    def _buffers(self) -> dict[torch.device, torch.Tensor]:
        # zeros, not empty: the pages are touched here, at the start, not by the first sync step
        return {
            device: torch.zeros(size, dtype=torch.float32, device=device)
            for device, size in self.sizes.items()
        }

    def take(self, fragment: int) -> dict[str, torch.Tensor]:
        """Float32 views laid out for the fragment's tensors in a free buffer, now the fragment's."""
        buffers = (
            self.free.pop() if self.free else self._buffers()
        )  # more in flight than asked: never, as rounds go
        self.held[fragment] = buffers
        views, offsets = {}, dict.fromkeys(buffers, 0)
        for name, device, shape in self.layouts[fragment]:
            start, size = offsets[device], math.prod(shape)
            views[name] = buffers[device][start : start + size].view(shape)
            offsets[device] = start + size
        return views

    def release(self, keep: Callable[[int], bool]) -> None:
        """Free the buffers of every fragment for which `keep` is false."""
        for fragment in [q for q in self.held if not keep(q)]:
            self.free.append(self.held.pop(fragment))
        del self.free[max(0, self.count - len(self.held)) :]  # any made beyond `count` go once free

    def scratch(self) -> Callable[[str], torch.Tensor | None] | None:
        """A free buffer lent as room for one tensor at a time (mixing.py's `scratch`: a commit's change,
        tensor by tensor), None when every buffer holds a snapshot. Valid until the next `take`."""
        if not self.free:
            return None
        buffers = self.free[-1]

        def room(name: str) -> torch.Tensor | None:
            device, shape = self.shapes[name]
            return buffers[device][: math.prod(shape)].view(shape) if device in buffers else None

        return room

    def buffers(self) -> int:
        """How many buffer sets the pool holds, taken or free."""
        return len(self.free) + len(self.held)
