"""DeMo's exchange over torch.distributed: one all-gather of every node's fixed-size indices and one of its
values, tensors only (object collectives pickle, and nothing here unpickles). The tensors travel in the
dtypes the caller chose (int16 indices and bf16 values for DeMo's defaults).
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

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        # As bytes: gloo has no int16, and the bytes are what travels anyway.
        raw = tensor.contiguous().view(torch.uint8)
        rows = [torch.empty_like(raw) for _ in range(self.nodes)]
        dist.all_gather(rows, raw, group=self.group)
        return torch.stack(rows).view(tensor.dtype)

    def all_gather(self, indices: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._gather(indices), self._gather(values)
