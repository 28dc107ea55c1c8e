"""What the simulator tests share: the session tests' tiny model, batches and SGD, as sim.run takes them."""

import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]  # the repository root, so that `tests.session` imports
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.session.nodes import batches, run_nodes, tiny_mlp  # noqa: E402

__all__ = ["batches", "run_nodes", "tiny_mlp", "sgd", "mse", "data_for", "parameters", "max_difference"]


def sgd(lr: float = 0.1):
    return lambda params: torch.optim.SGD(params, lr=lr)


def mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def data_for(workers: int, steps: int):
    """batches(worker, step) for sim.run: each worker's batches, as run_nodes trains node i on batches(i, steps)."""
    data = {worker: batches(worker, steps) for worker in range(workers)}
    return lambda worker, step: data[worker][step]


def parameters(model) -> dict[str, np.ndarray]:
    return {name: p.detach().numpy().copy() for name, p in model.named_parameters()}


def max_difference(a, b) -> float:
    a, b = parameters(a), parameters(b)
    return max(float(np.abs(a[name] - b[name]).max()) for name in a)
