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
frameworks; convolution weights do not (MLX puts channels last), which no renaming fixes.

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


class MLXAdapter:
    """tensors: run name -> MLX name of what the run synchronizes; frozen_names and local: likewise, of the
    frozen arrays (checked at join) and the node's own. Arrays are looked up afresh at each call: MLX's
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
        self.schema = [
            (run, tuple(arrays[name].shape), _dtype_name(arrays[name])) for run, name in self.tensors.items()
        ]

    def _arrays(self, names: Iterable[str], by: dict[str, str]) -> dict[str, mx.array]:
        flat = dict(tree_flatten(self.model.parameters()))
        return {name: flat[by[name]] for name in names}

    def snapshot(self, names: list[str]) -> Arrays:
        return _host(self._arrays(names, self.tensors), float_as=mx.float32)

    def _update(self, values: dict[str, mx.array], by: dict[str, str]) -> None:
        mx.eval(*values.values())  # done here, between two steps, not left to lengthen the next step's graph
        self.model.update(tree_unflatten([(by[name], array) for name, array in values.items()]))

    def _rounded(self, current: dict[str, mx.array], values: Arrays) -> dict[str, mx.array]:
        """Each value in its array's dtype, as torch's `copy_` rounds it."""
        return {name: mx.array(np.asarray(values[name])).astype(current[name].dtype) for name in current}

    def assign(self, values: Arrays) -> None:
        current = self._arrays(values, self.tensors)
        self._update(self._rounded(current, values), self.tensors)

    def blend(self, values: Arrays, mixing: float) -> None:
        """θ ← mixing·θ + (1 − mixing)·values, as torch's lerp_: values rounded to θ's dtype, the blend
        computed in float32 and rounded back (to within torch's last bit: it fuses the multiply-add)."""
        current = self._arrays(values, self.tensors)
        ends, weight = self._rounded(current, values), 1.0 - mixing
        blended = {}
        for name, theta in current.items():
            theta32, end32 = theta.astype(mx.float32), ends[name].astype(mx.float32)
            blended[name] = (theta32 + weight * (end32 - theta32)).astype(theta.dtype)
        self._update(blended, self.tensors)

    def shift(self, change: Arrays | Iterable[tuple[str, np.ndarray]]) -> None:
        """θ ← θ + change, the change rounded to θ's dtype first (as torch's add_); a lazy sequence of
        (name, array) is applied one tensor at a time."""
        for name, array in change.items() if isinstance(change, dict) else change:
            theta = self._arrays([name], self.tensors)[name]
            self._update({name: theta + mx.array(np.asarray(array)).astype(theta.dtype)}, self.tensors)

    def frozen(self) -> list[list]:
        """[name, shape, dtype, sha256 of the bytes] of each frozen array: torch's digest of the same values."""
        arrays = self._arrays(self.frozen_names, self.frozen_names)
        return [[name, list(a.shape), _dtype_name(a), hashlib.sha256(_raw_bytes(a)).hexdigest()]
                for name, a in arrays.items()]  # fmt: skip

    def local_state(self) -> Arrays:
        return _host(self._arrays(self.local, self.local), float_as=mx.float32)

    def load_local_state(self, values: Arrays) -> None:
        current = self._arrays(values, self.local)
        self._update(self._rounded(current, values), self.local)


def _dtype_name(array: mx.array) -> str:
    return str(array.dtype).removeprefix("mlx.core.")  # "float32", "bfloat16": torch's names


def _host(arrays: dict[str, mx.array], float_as: mx.Dtype) -> Arrays:
    """Writable host copies, floating arrays as `float_as` (numpy has no bfloat16), others as they are."""
    cast = {
        name: a.astype(float_as) if mx.issubdtype(a.dtype, mx.floating) else a for name, a in arrays.items()
    }
    mx.eval(*cast.values())
    return {name: np.array(a, copy=True) for name, a in cast.items()}


def _raw_bytes(array: mx.array) -> bytes:
    if array.dtype == mx.bfloat16:  # numpy cannot hold it: its 16-bit patterns, as torch stores them
        array = array.view(mx.uint16)
    return np.ascontiguousarray(np.array(array)).tobytes()


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
