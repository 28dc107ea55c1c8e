"""A node's own judge of its contributions, before they are published: the norms per step of its recently
merged contributions, and whether a new Δ is far beyond them (robust.beyond_history, the merger's rule for
a lone contribution, here by the node's own history), which means the model was changed outside training.
"""

from collections import deque

from ..algorithms.robust import beyond_history
from .judge import HISTORY


class OwnNorms:
    def __init__(self, factor: float | None) -> None:
        self.factor = factor  # the method's max_norm_ratio; None judges nothing
        self.merged: dict[int, deque[float]] = {}  # fragment -> ‖Δ‖ per step of recent merged contributions
        self.awaited: dict[int, float] = {}  # fragment -> that of the contribution awaiting its commit

    def judge(self, fragment: int, norm: float, steps: int) -> str | None:
        """Why a Δ of this norm, spanning `steps` steps, must not be published; None if it may."""
        history = self.merged.get(fragment)
        if self.factor is None or not history:
            return None  # a first contribution, however large, is never judged
        return beyond_history(norm, steps, history, self.factor, whose="this node's")

    def sent(self, fragment: int, norm: float, steps: int) -> None:
        self.awaited[fragment] = norm / max(steps, 1)

    def settled(self, fragment: int, merged: bool) -> None:
        """The commit of the awaited contribution arrived; only a merged one joins the history."""
        norm = self.awaited.pop(fragment, None)
        if merged and norm is not None:
            self.merged.setdefault(fragment, deque(maxlen=HISTORY)).append(norm)
