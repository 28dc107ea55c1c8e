"""What aligning a fragment with a new commit Θ_new does to the node's live parameters θ.

blend (Streaming DiLoCo §2.3, α = mixing), for a commit that holds this node's contribution:
    θ ← α·θ + (1−α)·Θ_new
carry, the default for such a commit: keep the steps trained since the snapshot θ_s = Θ_old − Δ:
    θ ← θ + (Θ_new − θ_s) = θ + (Θ_new − Θ_old + Δ)
carry, for a commit without this node's contribution (late, rejected, or none sent):
    θ ← θ + (Θ_new − Θ_old)
Carrying keeps every local step not yet merged; the next Δ, taken against Θ_new, holds them. Operators only:
the same code runs on numpy arrays and on torch tensors.
The `*_change` functions yield the change to add to θ one tensor at a time, so an adapter applies it in
place and no fragment-sized temporary exists; given `scratch` (name -> an array of that tensor's shape, which
the change may overwrite once the previous one is applied), no new array at all. A blend needs θ itself, which only the adapter holds: it is
the adapter's `blend` (frameworks/base.py), in place.
"""

from collections.abc import Callable, Iterator

import numpy as np

from ..arrays import Arrays, difference

Scratch = Callable[[str], np.ndarray | None]


def carry_change(
    old_anchor: Arrays, new_anchor: Arrays, scratch: Scratch | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    for name in new_anchor:
        yield name, difference(new_anchor[name], old_anchor[name], _out(scratch, name))


def carry_overlap_change(
    old_anchor: Arrays, new_anchor: Arrays, delta: Arrays, scratch: Scratch | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    for name in new_anchor:
        change = difference(new_anchor[name], old_anchor[name], _out(scratch, name))
        change += delta[name]
        yield name, change


def _out(scratch: Scratch | None, name: str) -> np.ndarray | None:
    return None if scratch is None else scratch(name)
