"""What slowlink needs from a framework, and the schema checks every adapter shares.

An adapter lists the model's parameters (name, shape, dtype), copies chosen ones to host float32
arrays, and writes host arrays back in place, so optimizer state keyed on the parameters survives.
"""

import hashlib
import json
from collections.abc import Iterable
from typing import Protocol

import numpy as np

from ..arrays import Arrays
from ..errors import ConfigError, SchemaMismatch

Schema = list[tuple[str, tuple[int, ...], str]]


class Adapter(Protocol):
    schema: Schema

    def snapshot(self, names: list[str]) -> Arrays:
        """Host float32 copies of these parameters, owned by the caller."""
        ...

    def assign(self, values: Arrays) -> None:
        """θ ← values, in place."""
        ...

    def blend(self, values: Arrays, mixing: float) -> None:
        """θ ← mixing·θ + (1 − mixing)·values, in place."""
        ...

    def shift(self, change: Arrays | Iterable[tuple[str, np.ndarray]]) -> None:
        """θ ← θ + change, in place; a lazy sequence of (name, array) is applied one tensor at a time."""
        ...


def adapter_for(model: object) -> Adapter:
    """The adapter for a torch or MLX module, chosen by the classes it derives from."""
    roots = {cls.__module__.split(".")[0] for cls in type(model).__mro__}
    if "torch" in roots:
        from .torch import TorchAdapter

        return TorchAdapter(model)
    if hasattr(model, "snapshot") and hasattr(model, "assign") and hasattr(model, "schema"):
        return model  # already an adapter
    raise ConfigError(
        f"model of type {type(model).__name__} is not supported: pass a torch.nn.Module "
        "(or an object implementing slowlink.frameworks.Adapter)"
    )


def schema_digest(schema: Schema) -> str:
    canonical = json.dumps(
        [[name, list(shape), dtype] for name, shape, dtype in schema], separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def compare_schemas(mine: Schema, run: Schema) -> None:
    """Raise SchemaMismatch naming the first tensor that differs and how."""
    run_by_name = {name: (tuple(shape), dtype) for name, shape, dtype in run}
    mine_names = {name for name, _, _ in mine}
    for name, shape, dtype in mine:
        if name not in run_by_name:
            raise SchemaMismatch(
                f"this model has tensor {name!r} {tuple(shape)} {dtype}, which the run's model does not have; "
                "every node must train the same architecture"
            )
        run_shape, run_dtype = run_by_name[name]
        if tuple(shape) != run_shape:
            raise SchemaMismatch(
                f"tensor {name!r} has shape {tuple(shape)} here but {run_shape} in the run; "
                "every node must train the same architecture"
            )
        if dtype != run_dtype:
            raise SchemaMismatch(
                f"tensor {name!r} is {dtype} here but {run_dtype} in the run; cast the model to {run_dtype}"
            )
    for name, shape, dtype in run:
        if name not in mine_names:
            raise SchemaMismatch(
                f"the run's model has tensor {name!r} {tuple(shape)} {dtype}, which this model lacks; "
                "every node must train the same architecture"
            )
