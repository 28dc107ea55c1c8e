"""Tagged JSON: the part of a checkpoint's state that is not tensors (the optimizer's param_groups, the user's
`extra`), kept in the file's header so that tuples, integer keys, big integers and non-finite floats come back
as they were. Tensors and numpy arrays become safetensors entries that the JSON names. Nothing is pickled.
"""

import math
from collections.abc import Callable

import numpy as np

from ..errors import ConfigError

KINDS = "tensors, numpy arrays, numbers, strings, None, lists, tuples and dicts (never pickled objects)"


def to_tagged(value: object, store: Callable[[object], str], where: str) -> object:
    """`value` as tagged JSON; `store(tensor or array)` keeps one and returns the entry's key. `where` names
    the value in errors ("extra['scheduler']")."""
    if isinstance(value, np.ndarray) and value.dtype.hasobject:
        raise ConfigError(f"{where} is a numpy array of Python objects; a checkpoint stores numbers only")
    if isinstance(value, np.ndarray) or _is_torch_tensor(value):
        return {"ndarray" if isinstance(value, np.ndarray) else "tensor": store(value)}
    if isinstance(value, np.generic):
        value = value.item()  # a numpy scalar: its Python number
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}  # JSON has no NaN or infinity
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) < value < 2**63:
        return {"int": str(value)}  # beyond what the header's JSON reader takes (a PCG64 state's 128 bits)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {
            "dict": [
                [to_tagged(k, store, where), to_tagged(v, store, f"{where}[{k!r}]")] for k, v in value.items()
            ]
        }
    if isinstance(value, tuple):
        return {"tuple": [to_tagged(v, store, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [to_tagged(v, store, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ConfigError(f"{where} is a {type(value).__name__}; a checkpoint holds {KINDS}")


def _is_torch_tensor(value: object) -> bool:
    """Without importing torch: a tensor can only come from a process that imported it."""
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach")


def from_tagged(value: object, opened: object, prefix: str) -> object:
    """What to_tagged was given, from its JSON and the opened safetensors file; a tensor must be an entry
    under `prefix`. Raises ValueError (or TypeError, KeyError) for anything to_tagged does not write."""
    if isinstance(value, list):
        return [from_tagged(v, opened, prefix) for v in value]
    if not isinstance(value, dict):
        return value
    ((tag, body),) = value.items()
    if tag in ("tensor", "ndarray") and isinstance(body, str) and body.startswith(prefix):
        found = opened.get_tensor(body)  # a numpy array where the file was opened without torch
        return found.numpy() if tag == "ndarray" and not isinstance(found, np.ndarray) else found
    if tag == "float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "int" and isinstance(body, str) and len(body) <= 64:
        return int(body)
    if tag == "tuple":
        return tuple(from_tagged(v, opened, prefix) for v in body)
    if tag == "dict":
        return {from_tagged(k, opened, prefix): from_tagged(v, opened, prefix) for k, v in body}
    raise ValueError(f"unknown tag {tag!r}")
