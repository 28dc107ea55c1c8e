"""DeMo's exchange over torch.distributed: every node's packed coefficients (wire/coefficients.py), as bytes in
uint8 tensors. Two all-gathers a step: the sizes (packed sizes vary with the index coding), then the bytes,
padded to the largest. Tensors only: object collectives pickle, and nothing here unpickles.
"""

import torch
import torch.distributed as dist

from ..errors import ConfigError


class TorchDistributedExchange:
    """The all-gather of a torch.distributed group (the default group unless one is given)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(
                "TorchDistributedExchange needs an initialized process group: call "
                "torch.distributed.init_process_group(...) first (torchrun sets its environment)"
            )
        self.group = group
        self.nodes = dist.get_world_size(group)
        # NCCL gathers only tensors on the GPU; gloo those on the CPU.
        backend = dist.get_backend(group)
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )

    def _gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        rows = [torch.empty_like(tensor) for _ in range(self.nodes)]
        dist.all_gather(rows, tensor, group=self.group)
        return rows

    def all_gather(self, payload: bytes, *, step: int, max_bytes: int) -> list[bytes | None]:
        del step
        size = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        sizes = [int(s.item()) for s in self._gather(size)]
        longest = max(sizes)
        if longest > max_bytes:  # a peer that sends more than any node can: refuse before allocating
            raise ConfigError(f"a node sends {longest} bytes a step where at most {max_bytes} can be right: "
                              "the nodes run different models or options")  # fmt: skip
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        rows = self._gather(padded.to(self.device))
        return [row[:n].cpu().numpy().tobytes() for row, n in zip(rows, sizes, strict=True)]
