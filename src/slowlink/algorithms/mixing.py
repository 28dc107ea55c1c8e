"""What aligning a fragment with a new commit does to the node's live parameters.

blend (Streaming DiLoCo §2.3, α = mixing):  θ ← α·θ_local + (1−α)·Θ_commit
carry (a commit that does not contain this node's steps):  θ ← θ_local + (Θ_new − Θ_old)
Carry keeps every local step since the old anchor, so the next pseudo-gradient, taken against Θ_new,
still holds them: nothing trained is lost when a contribution misses its round.
"""

import numpy as np

Arrays = dict[str, np.ndarray]


def blend(local: Arrays, committed: Arrays, mixing: float) -> Arrays:
    return {name: mixing * local[name] + (1.0 - mixing) * committed[name] for name in committed}


def carry(local: Arrays, old_anchor: Arrays, new_anchor: Arrays) -> Arrays:
    return {name: local[name] + (new_anchor[name] - old_anchor[name]) for name in new_anchor}


def pseudo_gradient(anchor: Arrays, local: Arrays) -> Arrays:
    """Δ = θ_anchor − θ_local: points downhill, like a gradient (research/algorithms.md §0)."""
    return {name: anchor[name] - local[name] for name in anchor}
