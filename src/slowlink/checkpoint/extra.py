"""The rest of the training state in a checkpoint: `extra=`, a dict of the user's own (an LR scheduler's and a
GradScaler's state_dict, RNG states, a data loader's position). Tensors and numpy arrays become safetensors
entries `extra/<i>`; everything else tagged JSON in the file's header, so that tuples, integer keys and
non-finite floats come back as they were. Nothing is pickled: an object of another kind is refused, naming
where it sits."""

import itertools
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from ..errors import ConfigError, PayloadError
from ..protocol.records import MAX_RECORD_BYTES
from ..wire import bounded_json
from .tagged import from_tagged, to_tagged

PREFIX = "extra/"


def extra_to_json(extra: object, tensors: dict) -> dict:
    """`extra` as tagged JSON; its tensors and arrays are added to `tensors` as entries `extra/<i>` (numpy
    arrays as they are: a node without torch, an MLX one, saves them too)."""
    if not isinstance(extra, dict):
        raise ConfigError(
            f"extra={type(extra).__name__} must be a dict, e.g. {{'scheduler': sched.state_dict()}}"
        )

    numbers = itertools.count()

    def store(value: object) -> str:
        key = f"{PREFIX}{next(numbers)}"
        # A copy: safetensors refuses tensors that share memory, and the caller may change theirs.
        tensors[key] = (np.array(value) if isinstance(value, np.ndarray)
                        else value.detach().to("cpu", copy=True).contiguous())  # fmt: skip
        return key

    return to_tagged(extra, store, "extra")


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
            extra = from_tagged(saved, opened, PREFIX)
    except (SafetensorError, ValueError, TypeError, KeyError, AttributeError) as error:
        raise PayloadError(
            f"{path}: the extra state cannot be read ({error}); use an earlier checkpoint"
        ) from None
    if not isinstance(extra, dict):
        raise PayloadError(f"{path}: the extra state is not a dict")
    return extra
