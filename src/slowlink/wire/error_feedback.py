"""Error feedback: a node keeps what its encoding lost and adds it to its next contribution.

    compensated = Δ + e,   sent = decode(encode(compensated)),   e' = compensated − sent

Over rounds the sum of what a node sent equals the sum of its true Δ minus its current residual e, so
encoding error stays bounded instead of accumulating (research/algorithms.md §2.4 sends 4-bit Δ with
no feedback; GradientMail drops the error too). The residual is the node's own state, never sent.
"""

import numpy as np

from ..arrays import Arrays
from .encodings import Encoding, get_encoding


def error_feedback_encode(
    values: np.ndarray, residual: np.ndarray | None, encoding: str | Encoding
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Encode `values` plus the `residual` (None: zeros); return the entries and the new residual."""
    codec = get_encoding(encoding) if isinstance(encoding, str) else encoding
    compensated = np.array(values, dtype=np.float32)  # a copy: the entries may share its memory
    if residual is not None:
        if residual.shape != compensated.shape:
            raise ValueError(f"residual has shape {residual.shape}, values {compensated.shape}")
        compensated += residual
    entries = codec.encode(compensated)
    return entries, compensated - codec.decode(entries, compensated.shape)


def encode_arrays_with_feedback(
    arrays: Arrays, residual: Arrays | None, encoding: str
) -> tuple[dict[str, tuple[tuple[int, ...], dict[str, np.ndarray]]], Arrays]:
    """`error_feedback_encode` over a fragment: (name -> (shape, entries) for payload.pack_encoded, new residual)."""
    codec = get_encoding(encoding)
    encoded, new_residual = {}, {}
    for name, values in arrays.items():
        entries, new_residual[name] = error_feedback_encode(
            values, None if residual is None else residual[name], codec
        )
        encoded[name] = (values.shape, entries)
    return encoded, new_residual
