"""The node's clone buffers (engine/clones.py): every fragment fits any buffer, a buffer is reused once its
snapshot settles, and a commit's change computed in a free buffer has the bits of one computed in new memory."""

import numpy as np
import torch

from slowlink.algorithms.mixing import carry_change, carry_overlap_change
from slowlink.engine.clones import ClonePool


def tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    shapes = {"a": (3, 4), "b": (4,), "c": (5, 2), "d": (), "e": (7,)}
    return {name: torch.randn(shape) for name, shape in shapes.items()}


def test_any_fragment_is_laid_out_in_any_buffer_and_a_settled_one_is_reused():
    model, plan = tensors(), [["a", "b"], ["c", "d"], ["e"]]
    pool = ClonePool(model, plan, count=2)
    first = pool.take(0)
    assert {name: tuple(v.shape) for name, v in first.items()} == {"a": (3, 4), "b": (4,)}
    second = pool.take(2)
    assert pool.free == [] and pool.buffers() == 2
    pool.release(keep=lambda q: q == 2)  # fragment 0's commit came: its buffer is free again
    third = pool.take(1)
    assert third["c"].data_ptr() == first["a"].data_ptr()  # laid out from the same buffer's front
    assert third["d"].shape == () and second["e"].shape == (7,)
    for name, view in {**third, **second}.items():
        view.copy_(model[name])
    assert all(torch.equal(third[n], model[n]) for n in third) and torch.equal(second["e"], model["e"])


def test_buffers_made_beyond_the_count_go_once_free():
    pool = ClonePool(tensors(), [["a"], ["b"], ["c"]], count=1)
    pool.take(0)
    pool.take(1)  # more in flight than asked: a buffer is made
    assert pool.buffers() == 2
    pool.release(keep=lambda q: False)
    assert pool.buffers() == 1


def test_a_change_computed_in_the_scratch_has_the_bits_of_one_in_new_memory():
    torch.manual_seed(1)
    old = {name: torch.randn(t.shape) for name, t in tensors().items()}
    new = {name: v + 1e-3 * torch.randn(v.shape) for name, v in old.items()}
    delta = {name: 1e-2 * torch.randn(v.shape) for name, v in old.items()}
    pool = ClonePool(old, [list(old)], count=1)
    for change, expected in [
        (carry_change(old, new, pool.scratch()), carry_change(old, new)),
        (carry_overlap_change(old, new, delta, pool.scratch()), carry_overlap_change(old, new, delta)),
    ]:
        expected = {name: v.clone() for name, v in expected}
        for name, values in change:  # one tensor at a time: the scratch is overwritten by the next
            assert torch.equal(values, expected[name]), name
            assert values.data_ptr() == pool.free[0].get(values.device).data_ptr()  # in the free buffer
    pool.take(0)
    assert pool.scratch() is None  # no free buffer: the change goes into new memory


def test_host_anchors_beside_torch_buffers_take_their_change_in_new_memory():
    """The simulator's nodes hold their anchors as host arrays though their models are torch modules: the
    pool's scratch is then left alone, and the change is what it would be without one."""
    old = {name: t.numpy() for name, t in tensors().items()}
    new = {name: v + np.float32(0.5) for name, v in old.items()}
    pool = ClonePool(tensors(), [list(old)], count=1)
    for name, change in carry_change(old, new, pool.scratch()):
        assert isinstance(change, np.ndarray | np.generic) and np.array_equal(change, new[name] - old[name])
