"""The one array type the layers pass between them: named float32 tensors of a fragment, numpy arrays on the
host (torch tensors, on the model's device, go through the same operator-only math of algorithms/).

Shared vocabulary, like errors.py: every layer may import it.
"""

import numpy as np

Arrays = dict[str, np.ndarray]


def zeros_like(values: np.ndarray) -> np.ndarray:
    """Float32 zeros of a numpy array's shape, or of a torch tensor's shape, dtype and device: where the
    algorithms make a new array, the one place that tells the two apart."""
    if isinstance(values, np.ndarray):
        return np.zeros(values.shape, np.float32)  # (x − x would turn a 0-d array into a numpy scalar)
    return values.new_zeros(values.shape)
