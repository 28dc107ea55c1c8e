"""A torch optimizer's state_dict in a checkpoint: its tensors as safetensors entries `optimizer/<i>`, the rest
(param_groups, numbers) as tagged JSON (tagged.py), so that tuples and integer keys come back as they were. No pickle."""

from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from ..errors import ConfigError, PayloadError
from ..session import Session
from .file import check_fields
from .tagged import from_tagged, to_tagged

PREFIX = "optimizer/"


def optimizer_to_json(optimizer: object, tensors: dict) -> dict:
    """A torch optimizer's state_dict as JSON, its tensors as entries `optimizer/<i>` of the same file."""
    import torch

    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"optimizer={type(optimizer).__name__} must be a torch.optim.Optimizer (or None)")

    named: dict[int, str] = {}  # a tensor named twice is stored once: safetensors refuses shared memory

    def store(value: object) -> str:
        if id(value) not in named:
            named[id(value)] = key = f"{PREFIX}{len(tensors)}"
            tensors[key] = (torch.from_numpy(np.array(value)) if isinstance(value, np.ndarray)
                            else value.detach().to("cpu").contiguous())  # fmt: skip
        return named[id(value)]

    return {
        "class": type(optimizer).__qualname__,
        "shapes": [[list(p.shape) for p in group["params"]] for group in optimizer.param_groups],
        "state": to_tagged(optimizer.state_dict(), store, "the optimizer's state"),
    }


def optimizer_from_file(path: Path, header: dict, optimizer: object, session: Session) -> dict:
    import torch

    saved = header.get("optimizer")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"optimizer={type(optimizer).__name__} must be a torch.optim.Optimizer (or None)")
    if saved is None:
        raise ConfigError(f"{path} holds no optimizer state: pass optimizer=None, or save with the optimizer")
    check_fields(saved, {"class": str, "shapes": list, "state": dict}, f"{path} optimizer")
    if saved["class"] != type(optimizer).__qualname__:
        raise ConfigError(f"{path} holds the state of a {saved['class']} optimizer, not of this "
                          f"{type(optimizer).__qualname__}: build the optimizer the run used")  # fmt: skip
    names = {id(p): name for name, p in getattr(session.model, "named_parameters", lambda: [])()}
    shapes = [[list(p.shape) for p in group["params"]] for group in optimizer.param_groups]
    if [len(group) for group in saved["shapes"]] != [len(group) for group in shapes]:
        raise ConfigError(f"{path} holds an optimizer with parameter groups of sizes "
                          f"{[len(g) for g in saved['shapes']]}; this one has {[len(g) for g in shapes]}: build it "
                          "over the same parameters, in the same groups and order")  # fmt: skip
    for g, (mine, theirs) in enumerate(zip(shapes, saved["shapes"], strict=True)):
        for i, (shape, saved_shape) in enumerate(zip(mine, theirs, strict=True)):
            if shape != saved_shape:
                name = names.get(id(optimizer.param_groups[g]["params"][i]), f"#{i}")
                raise ConfigError(f"{path}: the optimizer's parameter {name} (group {g}) has shape {saved_shape} "
                                  f"there and {shape} here: build the optimizer over the same parameters, in "
                                  "the same order")  # fmt: skip
    try:
        with safe_open(path, framework="pt") as opened:
            state = from_tagged(saved["state"], opened, PREFIX)
    except (SafetensorError, ValueError, TypeError, KeyError) as error:
        raise PayloadError(f"{path}: the optimizer's state cannot be read ({error}); use an earlier "
                           "checkpoint, or pass optimizer=None to start the optimizer afresh") from None  # fmt: skip
    if not isinstance(state, dict) or not isinstance(state.get("param_groups"), list):
        raise PayloadError(f"{path}: the optimizer's state is not a torch state_dict")
    return state
