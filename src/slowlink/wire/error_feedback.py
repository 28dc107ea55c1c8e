"""Error feedback: a node keeps what its encoding lost and adds it to its next contribution.

    compensated = Δ + e,   sent = decode(encode(compensated)),   e' = compensated − sent

Over rounds the sum of what a node sent equals the sum of its true Δ minus its current residual e, so
encoding error stays bounded instead of accumulating (research/algorithms.md §2.4 sends 4-bit Δ with
no feedback; GradientMail drops the error too). The residual is the node's own state, never sent.
"""

import numpy as np

from ..arrays import float32_copy
from .encodings import Encoding, get_encoding


def error_feedback_encode(
    values: np.ndarray, residual: np.ndarray | None, encoding: str | Encoding
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Encode `values` plus the `residual` (None: zeros); return the entries and the new residual. Operators
    only: with a codec of wire/on_device.py, torch tensors are encoded on their device, residual included."""
    codec = get_encoding(encoding) if isinstance(encoding, str) else encoding
    compensated = float32_copy(values)  # a copy: the entries may share its memory
    if residual is not None:
        if residual.shape != compensated.shape:
            raise ValueError(f"residual has shape {residual.shape}, values {compensated.shape}")
        compensated += residual
    entries = codec.encode(compensated)
    return entries, compensated - codec.decode(entries, compensated.shape)
