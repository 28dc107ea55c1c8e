"""The rest of the training state in a checkpoint: `extra=`, a dict of the user's own (an LR scheduler's and a
GradScaler's state_dict, RNG states, a data loader's position). Tensors and numpy arrays become safetensors
entries `extra/<i>`; everything else tagged JSON in the file's header, so that tuples, integer keys and
non-finite floats come back as they were. Nothing is pickled: an object of another kind is refused, naming
where it sits."""

import math
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from ..errors import ConfigError, PayloadError
from ..protocol.records import MAX_RECORD_BYTES
from ..wire import bounded_json

PREFIX = "extra/"


def extra_to_json(extra: object, tensors: dict) -> dict:
    """`extra` as tagged JSON; its tensors and arrays are added to `tensors` as entries `extra/<i>` (numpy
    arrays as they are: a node without torch, an MLX one, saves them too)."""
    if not isinstance(extra, dict):
        raise ConfigError(
            f"extra={type(extra).__name__} must be a dict, e.g. {{'scheduler': sched.state_dict()}}"
        )

    count = [0]  # entries named so far

    def encode(value: object, where: str) -> object:
        if isinstance(value, np.ndarray) and value.dtype.hasobject:
            raise ConfigError(f"{where} is a numpy array of Python objects; a checkpoint stores numbers only")
        if isinstance(value, np.ndarray) or _is_torch_tensor(value):
            key, count[0] = f"{PREFIX}{count[0]}", count[0] + 1
            # A copy: safetensors refuses tensors that share memory, and the caller may change theirs.
            tensors[key] = (np.array(value) if isinstance(value, np.ndarray)
                            else value.detach().to("cpu", copy=True).contiguous())  # fmt: skip
            return {"ndarray" if isinstance(value, np.ndarray) else "tensor": key}
        if isinstance(value, np.generic):
            value = value.item()  # a numpy scalar: its Python number
        if isinstance(value, float) and not math.isfinite(value):
            return {"float": repr(value)}  # JSON has no NaN or infinity
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) < value < 2**63:
            return {
                "int": str(value)
            }  # beyond what the header's JSON reader takes (a PCG64 state's 128 bits)
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, dict):
            return {"dict": [[encode(k, where), encode(v, f"{where}[{k!r}]")] for k, v in value.items()]}
        if isinstance(value, tuple):
            return {"tuple": [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
        raise ConfigError(f"{where} is a {type(value).__name__}; a checkpoint's extra holds tensors, numpy arrays, "
                          "numbers, strings, None, lists, tuples and dicts (never pickled objects)")  # fmt: skip

    return {"dict": [[key, encode(value, f"extra[{key!r}]")] for key, value in extra.items()]}


def _is_torch_tensor(value: object) -> bool:
    """Without importing torch: a tensor can only come from a process that imported it."""
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach")


def _holds_tensors(saved: object) -> bool:
    if isinstance(saved, list):
        return any(map(_holds_tensors, saved))
    if isinstance(saved, dict):
        return "tensor" in saved or any(map(_holds_tensors, saved.values()))
    return False


def check_readable(header: str) -> None:
    """Refuse at save a header that load could not read back: over the size or nesting bounds of records
    (file.read decodes the header within them)."""
    try:
        bounded_json.loads(header, what="the checkpoint's header", max_bytes=MAX_RECORD_BYTES)
    except PayloadError as error:
        raise ConfigError(f"{error}: extra= is too large or too deeply nested for the header; put large data "
                          "in tensors or numpy arrays, which are stored beside it") from None  # fmt: skip


def extra_from_file(path: Path, saved: object) -> dict:
    """The `extra` that `save` was given, read back from the checkpoint at `path` ({} if it was given none)."""
    if saved is None:
        return {}
    try:
        # torch's reader only for torch tensors (bfloat16 ones included); numpy's, without torch, otherwise
        with safe_open(path, framework="pt" if _holds_tensors(saved) else "numpy") as opened:

            def decode(value: object) -> object:
                if isinstance(value, list):
                    return [decode(v) for v in value]
                if not isinstance(value, dict):
                    return value
                ((tag, body),) = value.items()
                if tag == "tensor" and isinstance(body, str) and body.startswith(PREFIX):
                    return opened.get_tensor(body)
                if tag == "ndarray" and isinstance(body, str) and body.startswith(PREFIX):
                    found = opened.get_tensor(body)
                    return found if isinstance(found, np.ndarray) else found.numpy()
                if tag == "float" and body in ("nan", "inf", "-inf"):
                    return float(body)
                if tag == "int" and isinstance(body, str) and len(body) <= 64:
                    return int(body)
                if tag == "tuple":
                    return tuple(decode(v) for v in body)
                if tag == "dict":
                    return {decode(k): decode(v) for k, v in body}
                raise ValueError(f"unknown tag {tag!r}")

            extra = decode(saved)
    except (SafetensorError, ValueError, TypeError, KeyError, AttributeError) as error:
        raise PayloadError(
            f"{path}: the extra state cannot be read ({error}); use an earlier checkpoint"
        ) from None
    if not isinstance(extra, dict):
        raise PayloadError(f"{path}: the extra state is not a dict")
    return extra
