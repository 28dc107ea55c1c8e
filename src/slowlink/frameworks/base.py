"""What slowlink needs from a framework, and the schema checks every adapter shares.

An adapter lists the tensors a run synchronizes (name, shape, dtype), copies chosen ones to host float32
arrays, and writes host arrays back in place, so optimizer state keyed on the parameters survives.
"""

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np

from ..arrays import Arrays
from ..errors import ConfigError, SchemaMismatch

Schema = list[tuple[str, tuple[int, ...], str]]
# [name, shape, dtype, sha256] of each frozen tensor: checked equal at join, never sent.
Frozen = list[list]


class Adapter(Protocol):
    """The members every adapter has. An adapter may also have `frozen()` (Frozen: the tensors it does not
    send but every node must hold equal), and `local_state()` / `load_local_state(arrays)` (the node's own
    tensors, which checkpoints save); without them it has none. An adapter may have `clone(names, into=None)`:
    float32 copies on the tensors' own device (written into `into`, an earlier clone, when given), which a
    channel brings to host (`host_arrays`) on its own thread; without it the engine takes a host `snapshot`
    on the training thread. An adapter with `clone` has `on_device(arrays)` too: float32 copies of host arrays
    where its tensors live, in which the node keeps its anchors (`on_device_of`). `assign`, `blend` and
    `shift` take host arrays or what `clone` and `on_device` give."""

    schema: Schema

    def snapshot(self, names: list[str]) -> Arrays:
        """Host float32 copies of these tensors, owned by the caller."""
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


def host_arrays(values: dict) -> Arrays:
    """Host numpy arrays of what an adapter's `clone` or `snapshot` gave: numpy arrays (and scalars) pass as
    they are, a device tensor is copied to host (a CPU tensor is viewed, not copied: the clone is the caller's
    own)."""
    return {
        name: v if isinstance(v, np.ndarray | np.generic) else v.cpu().numpy() for name, v in values.items()
    }


def on_device_of(adapter: Adapter) -> Callable[[Arrays], dict]:
    """How host arrays become the arrays a node keeps its anchors in: the adapter's `on_device`, or the arrays
    as they are for an adapter without one (its math runs on the host)."""
    return getattr(adapter, "on_device", None) or _as_they_are


def _as_they_are(values: Arrays) -> Arrays:
    return values


def adapter_for(model: object, params: object = None) -> Adapter:
    """The adapter for a torch or an MLX module, chosen by the classes it derives from; `params` chooses what
    it synchronizes (frameworks/torch.py: names, or a predicate name -> bool; None: the default). Each
    framework's module is imported only for a model of it."""
    roots = {cls.__module__.split(".")[0] for cls in type(model).__mro__}
    if "torch" in roots:
        from .torch import TorchAdapter

        return TorchAdapter(model, params)
    if "mlx" in roots:
        from .mlx import MLXAdapter

        return MLXAdapter(model, params)
    if hasattr(model, "snapshot") and hasattr(model, "assign") and hasattr(model, "schema"):
        if params is not None:
            raise ConfigError("params= chooses the tensors of a torch or MLX module; an adapter chooses its own "
                              "schema: give it the choice, e.g. MLXAdapter(model, params=..., names=...)")  # fmt: skip
        return model  # already an adapter
    raise ConfigError(
        f"model of type {type(model).__name__} is not supported: pass a torch.nn.Module, an mlx.nn.Module "
        "(or an object implementing slowlink.frameworks.Adapter)"
    )


def frozen_of(adapter: Adapter) -> Frozen:
    """The adapter's frozen tensors with their digests; none for an adapter that does not say."""
    frozen = getattr(adapter, "frozen", None)
    return frozen() if frozen is not None else []


def local_of(adapter: Adapter) -> Arrays:
    """Host copies of the node's own tensors (never synchronized, saved by checkpoints); none if it says none."""
    local_state = getattr(adapter, "local_state", None)
    return local_state() if local_state is not None else {}


def schema_digest(schema: Schema) -> str:
    canonical = json.dumps(
        [[name, list(shape), dtype] for name, shape, dtype in schema], separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def compare_schemas(mine: Schema, run: Schema) -> None:
    """Raise SchemaMismatch naming the first tensor that differs and how; for models of different tensor
    counts, the counts first (a deeper or shallower model), then the first position where they differ."""
    same = (
        "every node must train the same architecture, with the same tensors trainable (or chosen by params=)"
    )
    if len(mine) != len(run):
        at = next(i for i in range(max(len(mine), len(run))) if _at(mine, i) != _at(run, i))
        raise SchemaMismatch(
            f"the run's model has {len(run)} tensors, this one {len(mine)}; the first difference is tensor "
            f"{at + 1}: {_spec(mine, at)} here, {_spec(run, at)} in the run; {same}"
        )
    run_by_name = {name: (tuple(shape), dtype) for name, shape, dtype in run}
    mine_names = {name for name, _, _ in mine}
    for name, shape, dtype in mine:
        if name not in run_by_name:
            raise SchemaMismatch(
                f"this model has tensor {name!r} {tuple(shape)} {dtype}, which the run's model does not have; "
                + (_renaming_hint(name, (tuple(shape), dtype), run, mine_names) or same)
            )
        run_shape, run_dtype = run_by_name[name]
        if tuple(shape) != run_shape:
            raise SchemaMismatch(
                f"tensor {name!r} has shape {tuple(shape)} here but {run_shape} in the run; {same}"
            )
        if dtype != run_dtype:
            raise SchemaMismatch(
                f"tensor {name!r} is {dtype} here but {run_dtype} in the run; cast the model to {run_dtype}"
            )
    for name, shape, dtype in run:
        if name not in mine_names:
            raise SchemaMismatch(
                f"the run's model has tensor {name!r} {tuple(shape)} {dtype}, which this model lacks; {same}"
            )


def _renaming_hint(name: str, spec: tuple, run: Schema, mine: set[str]) -> str | None:
    """The fix when the run holds a tensor of the same shape and dtype under a name this model lacks: most
    likely the same tensor, named differently by another framework (MLX's and torch's differ)."""
    other = next((n for n, shape, dtype in run if n not in mine and (tuple(shape), dtype) == spec), None)
    if other is None:
        return None
    return (f"the run has {other!r} {spec[0]} {spec[1]}, which this model lacks. If the two are one tensor "
            "named differently (MLX and torch name some modules differently), give the MLX node the run's name: "
            "sl.Session(MLXAdapter(model, names={'<MLX name>': '<run name>'}), ...) (slowlink.frameworks.mlx, "
            "docs/frameworks.md); otherwise every node must train the same architecture")  # fmt: skip


def _at(schema: Schema, index: int) -> tuple | None:
    if index >= len(schema):
        return None
    name, shape, dtype = schema[index]
    return name, tuple(shape), dtype


def _spec(schema: Schema, index: int) -> str:
    found = _at(schema, index)
    return "none" if found is None else f"{found[0]!r} {found[1]} {found[2]}"


def compare_frozen(mine: Frozen, run: Frozen) -> None:
    """Raise SchemaMismatch naming the first frozen tensor that is not the run's: frozen weights are never
    sent, so a node holding others would train another model under the same name."""
    run_by_name = {name: (tuple(shape), dtype, sha) for name, shape, dtype, sha in run}
    mine_names = {name for name, _, _, _ in mine}
    for name, shape, dtype, sha in mine:
        theirs = run_by_name.get(name)
        if theirs is None:
            raise SchemaMismatch(f"this model's tensor {name!r} is frozen (requires_grad=False), but not in "
                                 "the run's model: every node must freeze the same parameters")  # fmt: skip
        if (tuple(shape), dtype) != theirs[:2]:
            raise SchemaMismatch(f"frozen tensor {name!r} is {tuple(shape)} {dtype} here but {theirs[0]} "
                                 f"{theirs[1]} in the run; every node must load the same frozen weights")  # fmt: skip
        if sha != theirs[2]:
            raise SchemaMismatch(
                f"frozen tensor {name!r} differs from the run's (sha256 {sha[:12]}… here, {theirs[2][:12]}… in "
                "the run): frozen weights are never sent, so every node must load the same ones before it "
                "joins (the same base checkpoint, or the same seed)"
            )
    missing = sorted(run_by_name.keys() - mine_names)
    if missing:
        raise SchemaMismatch(f"the run's model has frozen tensor {missing[0]!r}, which this model does not "
                             "freeze: every node must freeze the same parameters")  # fmt: skip
