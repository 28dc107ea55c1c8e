"""Judging a round's contributions before the merger merges them: each record's claims against where it
sits, the claimed samples and steps bounded against each node's history (they give the merge weights), and
each Δ's measured norm against the others' and the fragment's recent ones. A Judge learns from each commit.
"""

import math
from collections import deque

from ..algorithms.method import Rounds
from ..algorithms.robust import bounded_claims, norm_outliers
from ..errors import PayloadError

HISTORY = 16  # recent norms per fragment and samples per step per node kept for judging later rounds
MAX_CLAIM_RATIO = 4.0  # how far a node's reported samples per step may exceed the others' (bounded_claims)
STEP_CAP_ROUNDS = 16  # a Δ counts as spanning at most this many rounds of steps, carried ones included


def check_record(record: dict, node: str, fragment: int, round_: int) -> None:
    """Refuse (PayloadError) a contribution record that names another place than its key, another anchor
    than the round's, or claims no honest node makes."""
    if record["node"] != node or record["fragment"] != fragment or record["round"] != round_:
        raise PayloadError(f"record names node {record['node']} fragment {record['fragment']} round "
                           f"{record['round']}, but sits at fragment {fragment} round {round_} for {node}")  # fmt: skip
    if record["base"] != round_ - 1:
        raise PayloadError(f"contribution is anchored at version {record['base']}, but round {round_} "
                           f"builds on version {round_ - 1}")  # fmt: skip
    if not (math.isfinite(record["norm"]) and record["norm"] >= 0):
        raise PayloadError(f"contribution reports a norm of {record['norm']}, not a finite number ≥ 0")
    if record["samples"] <= 0 or record["steps"] <= 0:
        raise PayloadError(f"contribution reports {record['steps']} steps and {record['samples']} samples")


class Judge:
    """What the merger remembers of recent commits to judge the next rounds by: each fragment's recent
    norms per step, and each node's recent samples per step."""

    def __init__(self, rounds: Rounds) -> None:
        self.max_norm_ratio = rounds.max_norm_ratio
        self.step_cap = STEP_CAP_ROUNDS * rounds.sync_every
        self.recent_norms: dict[int, deque[float]] = {}
        self.recent_per_step: dict[str, deque[float]] = {}

    def knows(self, fragment: int) -> bool:
        return fragment in self.recent_norms

    def history(self, fragment: int) -> list[float]:
        return list(self.recent_norms.get(fragment, ()))

    def bounded(self, claims: dict[str, tuple[int, int]]) -> dict[str, tuple[float, int]]:
        """Each node's (samples, steps) claims bounded by the others' and its own history (bounded_claims)."""
        return bounded_claims(claims, self.recent_per_step, max_steps=self.step_cap, ratio=MAX_CLAIM_RATIO)

    def judge_norm(self, node: str, norm: float, reported: dict[str, float], history: list[float],
                   anchor_norm: float, steps: int) -> None:  # fmt: skip
        """Refuse (PayloadError) a Δ whose measured norm is an outlier among the round's reported norms and
        the fragment's history, or many times the norm of the parameters it moves."""
        factor = self.max_norm_ratio
        if factor is None:
            return
        others = {other: value for other, value in reported.items() if other != node}
        reason = norm_outliers(others | {node: norm}, factor, history, {node: steps}).get(node)
        if reason is None and anchor_norm > 0 and norm > factor * anchor_norm:
            # No honest Δ is many times the parameters it moves: this holds even for a round's only
            # contribution in a run's first round, when there is nothing else to compare it with.
            reason = (f"its Δ's L2 norm {norm:.6g} is {norm / anchor_norm:.3g} times the fragment's own norm "
                      f"{anchor_norm:.6g}, above the limit of {factor:g} times")  # fmt: skip
        if reason is not None:
            raise PayloadError(reason)

    def remember(self, fragment: int, contributors: list[dict]) -> None:
        """Keep a commit's contributors' measured norms and samples per step, for judging later rounds."""
        norms = self.recent_norms.setdefault(fragment, deque(maxlen=HISTORY))
        for entry in contributors:
            if entry["steps"] > 0:  # a commit record's contributors are typed by records.CONTRIBUTOR
                if "norm" in entry:
                    norms.append(entry["norm"] / min(entry["steps"], self.step_cap))
                per_step = self.recent_per_step.setdefault(entry["node"], deque(maxlen=HISTORY))
                per_step.append(entry["samples"] / entry["steps"])


def contributors_of(
    accepted: dict[str, dict], weights: dict[str, float], norms: dict[str, float]
) -> list[dict]:
    """What a commit record says of each contribution it merged: its claims, and the weight and the norm
    the merger gave and measured."""
    return [
        {"node": node, "blob": r["blob"], "samples": r["samples"], "steps": r["steps"], "final": r["final"],
         "weight": weights[node], "norm": norms[node]}
        for node, r in sorted(accepted.items())
    ]  # fmt: skip
