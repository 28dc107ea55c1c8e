"""The helpers that tell numpy arrays from torch tensors: each gives a torch tensor, on its own device, what
it gives a numpy array, to the bit."""

import numpy as np
import pytest

from slowlink.arrays import float64_empty, subtract_into, zeros_like

torch = pytest.importorskip("torch")


def test_subtract_into_writes_the_pseudo_gradient_into_the_snapshot_in_place():
    rng = np.random.default_rng(0)
    anchor = rng.standard_normal(1000).astype(np.float32)
    snapshot = (anchor + rng.standard_normal(1000).astype(np.float32) * 1e-3).astype(np.float32)
    snapshot[:2] = [anchor[0], -0.0]  # an exact zero, and a value whose sign decides the zero's
    expected = anchor - snapshot
    on_host, on_torch = snapshot.copy(), torch.from_numpy(snapshot.copy())
    buffer = on_torch.data_ptr()
    subtract_into(anchor, on_host)
    subtract_into(torch.from_numpy(anchor), on_torch)
    assert on_host.tobytes() == expected.tobytes()
    assert on_torch.numpy().tobytes() == expected.tobytes() and on_torch.data_ptr() == buffer


def test_new_arrays_are_made_beside_the_values():
    values = torch.ones(3, 2)
    assert zeros_like(values).shape == (3, 2) and zeros_like(values).dtype == torch.float32
    assert float64_empty(values, 5).dtype == torch.float64 and float64_empty(values, 5).shape == (5,)
    assert float64_empty(np.ones(2, np.float32), 4).dtype == np.float64
