"""The PyTorch adapter: which of a module's tensors a run synchronizes, host copies of them, and in-place edits.

What travels (the schema), by default, in the module's order, parameters first:
- every trainable parameter (requires_grad=True), by its `named_parameters()` name;
- every floating-point persistent buffer (BatchNorm's running_mean and running_var), by its `named_buffers()`
  name. It is merged like a parameter: its pseudo-gradient is anchor − local like any tensor's, so with
  outer_lr=1 and no momentum a commit holds the nodes' average statistics.
What does not:
- frozen parameters (requires_grad=False): never sent. Their sha256 digests are recorded in the run, and a
  node whose frozen weights differ is refused when it joins (and by `sl.align`), naming the tensor;
- integer buffers (BatchNorm's num_batches_tracked): each node keeps its own, a count of the batches its own
  norm has seen. They are not synchronized and `sl.align` leaves them as they are; `sl.checkpoint` saves and
  restores them with the node's other local tensors;
- non-persistent buffers (not in `state_dict()`, e.g. rotary frequencies): the model rebuilds them itself.
`params=` (a list of names, or a predicate name -> bool) replaces the default choice: exactly the
floating-point tensors it selects travel. Of the rest, frozen parameters are checked at join, and any other
tensor is local (kept, and checkpointed, like an integer buffer). Every node must choose the same tensors.

Wrappers are looked through: torch.compile's module (`_orig_mod`) and DistributedDataParallel or
DataParallel (a module whose only child is `module`, holding no tensors of its own) have the plain model's
names, so a compiled or wrapped node joins a run of the plain model, and `params=` uses the plain names.

Clones stay on the tensors' device (the channel copies them to host off the training thread); snapshots are
host float32 copies; `on_device` brings host arrays (a commit's parameters) to the tensors' device, off the
training thread too; updates, from host arrays or device tensors, are computed on the tensor's own device and
dtype.
"""

import hashlib
import warnings
from collections.abc import Callable, Iterable

import numpy as np
import torch

from ..arrays import Arrays
from ..errors import ConfigError

# What `params=` accepts: tensor names, a predicate on names, or None for the default choice.
Selector = Iterable[str] | Callable[[str], bool] | None


class TorchAdapter:
    """tensors: what the run synchronizes, by name; frozen: frozen parameters, checked at join; local: the
    node's own tensors (integer buffers, and what `params=` leaves out), saved by checkpoints."""

    def __init__(self, model: torch.nn.Module, params: Selector = None) -> None:
        self.model = unwrapped(model)
        parameters = dict(self.model.named_parameters())
        buffers = {name: b for name, b in self.model.named_buffers() if _persistent(self.model, name)}
        everything = {**parameters, **buffers}
        chosen = _choose(parameters, buffers, params)
        self.tensors = {name: t for name, t in everything.items() if name in chosen}
        # Running statistics move with the data, not with training: merged, but left out of norm checks.
        self.statistics = sorted(chosen & buffers.keys())
        self.frozen_tensors = {
            name: p for name, p in parameters.items() if name not in chosen and not p.requires_grad
        }
        self.local = {
            name: t
            for name, t in everything.items()
            if name not in chosen and name not in self.frozen_tensors
        }
        self.schema = [
            (name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in self.tensors.items()
        ]

    def snapshot(self, names: list[str]) -> Arrays:
        with torch.no_grad():
            return {
                name: self.tensors[name].detach().to("cpu", torch.float32).numpy().copy() for name in names
            }

    def clone(self, names: list[str], into: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Float32 copies on the tensors' own device: all a sync step asks of the training thread. The
        channel moves them to host on its own thread (frameworks/base.py, host_arrays). `into`, float32
        tensors of the same names and shapes on the same devices (an earlier clone, or the node's held
        buffers: engine/clones.py), is overwritten instead: a copy without allocating (fresh memory costs a
        page fault per page on a CPU)."""
        with torch.no_grad():
            if into is None:
                return {
                    name: self.tensors[name].detach().to(dtype=torch.float32, copy=True) for name in names
                }
            # One call for the fragment: the interpreter lock is let go once, not once per tensor (the
            # communication thread holds it meanwhile, and each taking back may wait its switch interval).
            torch._foreach_copy_([into[name] for name in names], [self.tensors[name] for name in names])
            return into

    def on_device(self, values: Arrays) -> dict[str, torch.Tensor]:
        """Float32 tensors of host arrays, each on the device of the tensor it is named for: where the node
        keeps its anchors and applies commits. Where that device is the host, a tensor shares the array's
        memory, as the anchors do: nothing writes them in place."""
        return {name: self._on_device(name, array, dtype=torch.float32) for name, array in values.items()}

    def _on_device(
        self, name: str, values: np.ndarray | torch.Tensor, target: torch.Tensor | None = None, dtype=None
    ) -> torch.Tensor:
        """`values` (a host array, or a tensor anywhere) on the target's device, in `dtype` or its own."""
        target = self.tensors[name] if target is None else target
        if isinstance(values, np.ndarray):
            with warnings.catch_warnings():
                # Decoded payloads are read-only views of the received bytes; the tensor is only ever read.
                warnings.simplefilter("ignore", UserWarning)
                # (ascontiguousarray would make a 0-d array, a scalar parameter's or a step count's, 1-d)
                values = torch.from_numpy(
                    values if values.flags.c_contiguous else np.ascontiguousarray(values)
                )
        return values.to(target.device, target.dtype if dtype is None else dtype)

    def assign(self, values: Arrays) -> None:
        with torch.no_grad():
            for name, array in values.items():
                self.tensors[name].copy_(self._on_device(name, array))

    def blend(self, values: Arrays, mixing: float) -> None:
        with torch.no_grad():
            for name, array in values.items():
                self.tensors[name].lerp_(self._on_device(name, array), 1.0 - mixing)

    def shift(self, change: Arrays | Iterable[tuple[str, np.ndarray | torch.Tensor]]) -> None:
        """θ ← θ + change; `change` may be a lazy sequence of (name, array), applied one tensor at a time."""
        with torch.no_grad():
            for name, array in change.items() if isinstance(change, dict) else change:
                self.tensors[name].add_(self._on_device(name, array))

    def frozen(self) -> list[list]:
        """[name, shape, dtype, sha256 of the bytes] of each frozen parameter: what run.json records."""
        return [[name, list(p.shape), str(p.dtype).removeprefix("torch."), _digest(p)]
                for name, p in self.frozen_tensors.items()]  # fmt: skip

    def local_state(self) -> Arrays:
        """Host copies of the node's own tensors: floating-point ones as float32, others in their dtype."""
        return {name: t.detach().to("cpu", torch.float32 if t.is_floating_point() else t.dtype).numpy().copy()
                for name, t in self.local.items()}  # fmt: skip

    def load_local_state(self, values: Arrays) -> None:
        with torch.no_grad():
            for name, array in values.items():
                self.local[name].copy_(self._on_device(name, array, self.local[name]))


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside torch.compile's and DDP's wrappers, whose names carry no `_orig_mod.` or `module.`."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            children = dict(model.named_children())
            own = [*model.named_parameters(recurse=False), *model.named_buffers(recurse=False)]
            inner = children.get("module") if len(children) == 1 and not own else None
        if inner is None:
            return model
        model = inner


def _persistent(model: torch.nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    return leaf not in model.get_submodule(owner)._non_persistent_buffers_set


def _choose(parameters: dict, buffers: dict, params: Selector) -> set[str]:
    """The names of the tensors a run synchronizes: the default choice, or what `params=` selects."""
    floating = [name for name, t in {**parameters, **buffers}.items() if t.is_floating_point()]
    if params is None:
        chosen = {name for name, p in parameters.items() if p.requires_grad} | (
            buffers.keys() & set(floating)
        )
        if not chosen:
            raise ConfigError("this model has no trainable parameter nor floating-point buffer to synchronize; "
                              "choose its tensors with params=")  # fmt: skip
        return chosen
    if callable(params):
        chosen = {name for name in floating if params(name)}
    elif isinstance(params, str | bytes) or not isinstance(params, Iterable):
        raise ConfigError(
            f"params={params!r} must be a list of tensor names or a predicate name -> bool, "
            "e.g. params=lambda name: 'running' not in name"
        )
    else:
        chosen = set(params)
        unknown = sorted(chosen - parameters.keys() - buffers.keys())
        if unknown:
            raise ConfigError(f"params= names {unknown[:4]}, which the model does not have; its tensors are "
                              f"{_brief(list(parameters) + list(buffers))}")  # fmt: skip
        integer = sorted(chosen - set(floating))
        if integer:
            raise ConfigError(
                f"params= names {integer[:4]}, which are not floating-point: integer buffers cannot be "
                "averaged, each node keeps its own"
            )
    if not chosen:
        raise ConfigError(
            f"params= selects none of the model's tensors ({_brief(floating)}): nothing to train"
        )
    return chosen


def _brief(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _digest(tensor: torch.Tensor) -> str:
    data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(data).hexdigest()
