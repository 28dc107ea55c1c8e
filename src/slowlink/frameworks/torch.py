"""The PyTorch adapter: parameters by their `named_parameters()` names, edited in place under no_grad.

Snapshots are host float32 copies; updates are computed on the parameter's own device and dtype.
Buffers (e.g. batch-norm statistics) are local to each node and never synchronized.
"""

import warnings
from collections.abc import Iterable

import numpy as np
import torch

from ..arrays import Arrays


class TorchAdapter:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.parameters = dict(model.named_parameters())
        self.schema = [
            (name, tuple(p.shape), str(p.dtype).removeprefix("torch.")) for name, p in self.parameters.items()
        ]

    def snapshot(self, names: list[str]) -> Arrays:
        with torch.no_grad():
            return {
                name: self.parameters[name].detach().to("cpu", torch.float32).numpy().copy() for name in names
            }

    def _on_device(self, name: str, values: np.ndarray) -> torch.Tensor:
        target = self.parameters[name]
        with warnings.catch_warnings():
            # Decoded payloads are read-only views of the received bytes; the tensor is only ever read.
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(np.ascontiguousarray(values)).to(target.device, target.dtype)

    def assign(self, values: Arrays) -> None:
        with torch.no_grad():
            for name, array in values.items():
                self.parameters[name].copy_(self._on_device(name, array))

    def blend(self, values: Arrays, mixing: float) -> None:
        with torch.no_grad():
            for name, array in values.items():
                self.parameters[name].lerp_(self._on_device(name, array), 1.0 - mixing)

    def shift(self, change: Arrays | Iterable[tuple[str, np.ndarray]]) -> None:
        """θ ← θ + change; `change` may be a lazy sequence of (name, array), applied one tensor at a time."""
        with torch.no_grad():
            for name, array in change.items() if isinstance(change, dict) else change:
                self.parameters[name].add_(self._on_device(name, array))
