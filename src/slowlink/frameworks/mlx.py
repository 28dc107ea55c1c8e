"""The MLX adapter: which of an `mlx.nn.Module`'s arrays a run synchronizes, host copies of them, and updates
through `model.update`. A run's tensors have one name, shape and dtype whichever framework a node trains in,
so an MLX node and a PyTorch node of the same architecture train one run together (docs/frameworks.md).

What travels, by default, in `tree_flatten(model.parameters())` order: every trainable array, and BatchNorm's
running_mean and running_var (MLX freezes them; torch's BatchNorm sends them as buffers, and so does this
adapter). Other frozen arrays are never sent: their sha256 digests are checked at join, as torch's frozen
parameters are; non-floating arrays are the node's own (local, saved by checkpoints). `params=` chooses as it
does for torch, by run name.

Names: a run's names are torch's. MLX's `nn.Sequential` holds its layers in a list named `layers`
(`layers.0.weight`) where torch's says `0.weight`: that step is left out. `names=` maps the rest: a dict
{MLX name: run name} for the tensors named differently, or a callable MLX name -> run name that replaces the
default (`names=lambda name: name` keeps MLX's own). Linear and Embedding weights have the same layout in both
frameworks; convolution weights do not (MLX keeps the input channels last): the adapter moves that axis, so
a run holds torch's layout.

Arrays convert as torch's tensors do: float32 host copies out; in, a value is rounded to the array's dtype
(bfloat16 and float16 round to nearest, ties to even) before it is added or assigned. The math of a node runs
on the host (no `clone`): MLX arrays live in memory the CPU shares.
"""

import hashlib
from collections.abc import Callable, Iterable, Mapping

import numpy as np

try:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten, tree_unflatten
except ImportError as error:  # on Linux, plain `mlx` installs but cannot load: it has no libmlx.so
    raise ImportError(
        f"slowlink's MLX adapter needs a working MLX ({error}): pip install 'slowlink[mlx]', or on Linux "
        "pip install 'mlx[cpu]' (the plain mlx wheel has no Linux backend)"
    ) from error

from ..arrays import Arrays
from ..errors import ConfigError

Selector = Iterable[str] | Callable[[str], bool] | None
Names = Mapping[str, str] | Callable[[str], str] | None
STATISTICS = ("running_mean", "running_var")  # BatchNorm's, frozen by MLX, sent by torch
# Where torch holds the axis that MLX keeps last (the input channels) of a convolution's weight:
# Conv: torch (out, in, k...), MLX (out, k..., in); ConvTranspose: torch (in, out, k...), MLX (out, k..., in).
CHANNELS_AXIS = {nn.Conv1d: 1, nn.Conv2d: 1, nn.Conv3d: 1,
                 nn.ConvTranspose1d: 0, nn.ConvTranspose2d: 0, nn.ConvTranspose3d: 0}  # fmt: skip


class MLXAdapter:
    """tensors: run name -> MLX name of what the run synchronizes; frozen_names and local: likewise, of the
    frozen arrays (checked at join) and the node's own; moved: run name -> the axis where a convolution
    weight's last MLX axis sits in torch's layout, the run's. Arrays are looked up afresh at each call: MLX's
    optimizers and `model.update` replace them rather than writing into them."""

    def __init__(self, model: nn.Module, params: Selector = None, names: Names = None) -> None:
        if not isinstance(model, nn.Module):
            raise ConfigError(f"MLXAdapter(model) takes an mlx.nn.Module, not {type(model).__name__}")
        self.model = model
        arrays = dict(tree_flatten(model.parameters()))
        trainable = {name for name, _ in tree_flatten(model.trainable_parameters())}
        modules = dict(model.named_modules())
        statistics = {name for name in arrays.keys() - trainable if _is_statistic(modules, name)}
        run_name = _run_names(model, list(arrays), names)
        floating = {run_name[name] for name, a in arrays.items() if mx.issubdtype(a.dtype, mx.floating)}
        default = {run_name[name] for name in trainable | statistics} & floating
        chosen = _choose(default, floating, list(run_name.values()), params)
        self.tensors = {run_name[name]: name for name in arrays if run_name[name] in chosen}
        self.statistics = sorted(run_name[name] for name in statistics if run_name[name] in chosen)
        self.frozen_names = {run_name[name]: name for name in arrays
                             if run_name[name] not in chosen and name not in trainable | statistics}  # fmt: skip
        self.local = {run_name[name]: name for name in arrays
                      if run_name[name] not in chosen and run_name[name] not in self.frozen_names}  # fmt: skip
        self.moved = {
            run_name[name]: axis for name in arrays if (axis := _channels_axis(modules, name)) is not None
        }
        self.schema = [(run, _torch_shape(arrays[name].shape, self.moved.get(run)), _dtype_name(arrays[name]))
                       for run, name in self.tensors.items()]  # fmt: skip

    def _arrays(self, names: Iterable[str], by: dict[str, str]) -> dict[str, mx.array]:
        flat = dict(tree_flatten(self.model.parameters()))
        return {name: flat[by[name]] for name in names}

    def _out(self, arrays: Arrays) -> Arrays:
        """Host arrays in the run's layout: convolution weights as torch lays them out."""
        for name, axis in self.moved.items():
            if name in arrays:
                arrays[name] = np.ascontiguousarray(np.moveaxis(arrays[name], -1, axis))
        return arrays

    def _in(self, name: str, values: np.ndarray, dtype: mx.Dtype) -> mx.array:
        """A host array of the run's layout as an array of this model's, rounded to `dtype` as torch's
        `copy_` rounds."""
        values = np.asarray(values)
        if name in self.moved:
            values = np.moveaxis(values, self.moved[name], -1)
        return mx.array(values).astype(dtype)

    def snapshot(self, names: list[str]) -> Arrays:
        return self._out(_host(self._arrays(names, self.tensors)))

    def _update(self, values: dict[str, mx.array], by: dict[str, str]) -> None:
        mx.eval(*values.values())  # done here, between two steps, not left to lengthen the next step's graph
        self.model.update(tree_unflatten([(by[name], array) for name, array in values.items()]))

    def assign(self, values: Arrays) -> None:
        current = self._arrays(values, self.tensors)
        self._update(
            {name: self._in(name, values[name], a.dtype) for name, a in current.items()}, self.tensors
        )

    def blend(self, values: Arrays, mixing: float) -> None:
        """θ ← mixing·θ + (1 − mixing)·values, as torch's lerp_: values rounded to θ's dtype, the blend
        computed in float32 and rounded back (to within torch's last bit: it fuses the multiply-add)."""
        weight, blended = 1.0 - mixing, {}
        for name, theta in self._arrays(values, self.tensors).items():
            theta32 = theta.astype(mx.float32)
            end32 = self._in(name, values[name], theta.dtype).astype(mx.float32)
            blended[name] = (theta32 + weight * (end32 - theta32)).astype(theta.dtype)
        self._update(blended, self.tensors)

    def shift(self, change: Arrays | Iterable[tuple[str, np.ndarray]]) -> None:
        """θ ← θ + change, the change rounded to θ's dtype first (as torch's add_); a lazy sequence of
        (name, array) is applied one tensor at a time."""
        for name, array in change.items() if isinstance(change, dict) else change:
            theta = self._arrays([name], self.tensors)[name]
            self._update({name: theta + self._in(name, array, theta.dtype)}, self.tensors)

    def frozen(self) -> list[list]:
        """[name, shape, dtype, sha256 of the bytes] of each frozen array, in the run's layout: torch's digest
        of the same values."""
        arrays = self._arrays(self.frozen_names, self.frozen_names)
        bits = self._out({name: _raw_bits(a) for name, a in arrays.items()})
        return [[name, list(bits[name].shape), _dtype_name(a), hashlib.sha256(bits[name].tobytes()).hexdigest()]
                for name, a in arrays.items()]  # fmt: skip

    def local_state(self) -> Arrays:
        return self._out(_host(self._arrays(self.local, self.local)))

    def load_local_state(self, values: Arrays) -> None:
        current = self._arrays(values, self.local)
        self._update({name: self._in(name, values[name], a.dtype) for name, a in current.items()}, self.local)


def _dtype_name(array: mx.array) -> str:
    return str(array.dtype).removeprefix("mlx.core.")  # "float32", "bfloat16": torch's names


def _host(arrays: dict[str, mx.array]) -> Arrays:
    """Writable host copies, floating arrays as float32 (numpy has no bfloat16), others as they are."""
    cast = {
        name: a.astype(mx.float32) if mx.issubdtype(a.dtype, mx.floating) else a for name, a in arrays.items()
    }
    mx.eval(*cast.values())
    return {name: np.array(a, copy=True) for name, a in cast.items()}


def _raw_bits(array: mx.array) -> np.ndarray:
    """The array's bytes as a host array: bfloat16, which numpy cannot hold, as its 16-bit patterns."""
    return np.array(array.view(mx.uint16) if array.dtype == mx.bfloat16 else array)


def _channels_axis(modules: dict[str, nn.Module], name: str) -> int | None:
    owner, _, leaf = name.rpartition(".")
    return CHANNELS_AXIS.get(type(modules.get(owner))) if leaf == "weight" else None


def _torch_shape(shape: tuple[int, ...], axis: int | None) -> tuple[int, ...]:
    return tuple(shape) if axis is None else tuple(shape[:axis]) + (shape[-1],) + tuple(shape[axis:-1])


def _is_statistic(modules: dict[str, nn.Module], name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    return leaf in STATISTICS and isinstance(modules.get(owner), nn.BatchNorm)


def torch_names(model: nn.Module) -> Callable[[str], str]:
    """MLX name -> the name a torch model of the same structure gives: nn.Sequential's `layers` step left out
    (`layers.0.weight` -> `0.weight`, `mlp.layers.2.bias` -> `mlp.2.bias`)."""
    sequential = {path for path, module in model.named_modules() if isinstance(module, nn.Sequential)}

    def rename(name: str) -> str:
        parts = name.split(".")
        kept = [part for i, part in enumerate(parts)
                if not (part == "layers" and ".".join(parts[:i]) in sequential)]  # fmt: skip
        return ".".join(kept)

    return rename


def _run_names(model: nn.Module, own: list[str], names: Names) -> dict[str, str]:
    """MLX name -> run name of every array, refusing a mapping that names what the model lacks or gives two
    arrays one name."""
    default = torch_names(model)
    if names is None:
        run = {name: default(name) for name in own}
    elif callable(names):
        run = {name: names(name) for name in own}
    elif isinstance(names, Mapping):
        unknown = sorted(set(names) - set(own))
        if unknown:
            raise ConfigError(f"names= maps {unknown[:4]}, which this MLX model does not have; its arrays are "
                              f"{_brief(own)} (the names tree_flatten(model.parameters()) gives)")  # fmt: skip
        run = {name: names.get(name, default(name)) for name in own}
    else:
        raise ConfigError(f"names={names!r} must be a dict {{MLX name: run name}} or a callable MLX name -> run "
                          "name, e.g. names={'fc1.weight': '0.weight'}")  # fmt: skip
    bad = [(name, to) for name, to in run.items() if not isinstance(to, str) or not to]
    if bad:
        raise ConfigError(f"names= gives {bad[0][0]!r} the name {bad[0][1]!r}: a run name is a non-empty str")
    taken: dict[str, str] = {}
    for name, to in run.items():
        if to in taken:
            raise ConfigError(f"names= gives {taken[to]!r} and {name!r} the same run name {to!r}; every array "
                              "needs its own")  # fmt: skip
        taken[to] = name
    return run


def _choose(default: set[str], floating: set[str], every: list[str], params: Selector) -> set[str]:
    """The run names a run synchronizes: the default choice, or what `params=` selects (by run name)."""
    if params is None:
        chosen = default
    elif callable(params):
        chosen = {name for name in floating if params(name)}
    elif isinstance(params, str | bytes) or not isinstance(params, Iterable):
        raise ConfigError(f"params={params!r} must be a list of tensor names or a predicate name -> bool")
    else:
        chosen = set(params)
        unknown = sorted(chosen - set(every))
        if unknown:
            raise ConfigError(f"params= names {unknown[:4]}, which the model does not have; its tensors are "
                              f"{_brief(every)} (run names: docs/frameworks.md)")  # fmt: skip
        if chosen - floating:
            raise ConfigError(f"params= names {sorted(chosen - floating)[:4]}, which are not floating-point: "
                              "they cannot be averaged, each node keeps its own")  # fmt: skip
    if not chosen:
        raise ConfigError(f"this MLX model has nothing to synchronize among {_brief(every)}: no trainable "
                          "array, or params= selects none; choose its tensors with params=")  # fmt: skip
    return chosen


def _brief(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
