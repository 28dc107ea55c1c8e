"""The one array type the layers pass between them: named float32 tensors of a fragment, numpy arrays on the
host (torch tensors, on the model's device, go through the same operator-only math of algorithms/, and the
few helpers here that must tell the two apart).

Shared vocabulary, like errors.py: every layer may import it.
"""

import numpy as np

Arrays = dict[str, np.ndarray]


def zeros_like(values: np.ndarray) -> np.ndarray:
    """Float32 zeros of a numpy array's shape, or of a torch tensor's shape, dtype and device: where the
    algorithms make a new array, one of the few places that tell the two apart."""
    if isinstance(values, np.ndarray):
        return np.zeros(values.shape, np.float32)  # (x − x would turn a 0-d array into a numpy scalar)
    return values.new_zeros(values.shape)


def float32_copy(values: np.ndarray) -> np.ndarray:
    """A float32 copy of a numpy array, or of a torch tensor on its device (signs of zeros kept)."""
    if isinstance(values, np.ndarray):
        return np.array(values, dtype=np.float32)
    return values.detach().float().clone()


def float64_empty(values: np.ndarray, size: int) -> np.ndarray:
    """An uninitialised float64 vector of `size` beside `values` (on a torch tensor's device)."""
    if isinstance(values, np.ndarray):
        return np.empty(size, np.float64)
    import torch  # a tensor came: torch is imported already

    return values.new_empty(size, dtype=torch.float64)


def subtract_into(minuend: np.ndarray, values: np.ndarray) -> None:
    """values ← minuend − values, in place and in one pass, on a torch tensor's own device: how a snapshot's
    buffer becomes the pseudo-gradient Δ = anchor − snapshot with no second fragment-sized array."""
    if isinstance(values, np.ndarray):
        np.subtract(minuend, values, out=values)
        return
    import torch

    torch.sub(minuend, values, out=values)


def difference(minuend: np.ndarray, subtrahend: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """minuend − subtrahend, into `out` where given and of the minuend's kind (an array of their shape, or a
    tensor on their device; a simulated node's anchors are host arrays beside a model's tensors): the same
    bits either way, with no new array when `out` is held memory."""
    on_host = isinstance(minuend, np.ndarray | np.generic)  # (numpy makes a 0-d array's result a scalar)
    if out is None or isinstance(out, np.ndarray) != on_host:
        return minuend - subtrahend
    if on_host:
        return np.subtract(minuend, subtrahend, out=out)
    import torch

    return torch.sub(minuend, subtrahend, out=out)
