"""When the merger lists rounds/: only when a round can be due, not on every turn of its loop.

Its own contributions it knows without a listing; the others' come at about the same steps (every node
syncs on the same schedule), so one look when its own comes in, one when a grace window ends, and one at
least every sync of this node for nodes ahead of it, cost about one LIST per round.
"""

from ..algorithms import rounds as rounds_

SLACK = 0.05  # a grace window ending this soon counts as ended: the merger's turn comes at its end


class Looks:
    def __init__(self, rounds: rounds_.Rounds) -> None:
        self.rounds = rounds
        self.poll_seconds = 0.25  # the courier's: how soon a grace window's end counts as now
        self.look_seconds = (
            2.0  # the longest between two looks: the courier sets it (this node's sync period)
        )
        self.looked_at = float("-inf")
        self.own_unlisted = False  # this node's contribution came in since the last look
        self.ended: set[tuple[int, int]] = set()  # (fragment, round) whose grace window's end a look served
        self._ending: list[tuple[int, int]] = []

    def own_sent(self) -> None:
        self.own_unlisted = True

    def looked(self, now: float) -> None:
        self.looked_at, self.own_unlisted = now, False
        self.ended.update(self._ending)

    def due(self, now: float, open_rounds: dict, versions: dict) -> tuple[bool, float]:
        """(Whether to list rounds/ now, when the next look is due.) open_rounds: the merger's open round by
        fragment (merger.OpenRound); versions: the fragments it merges now (fragment -> its newest commit, ...).

        Due when this node's own contribution came in since the last look (unless a grace window ends
        within poll_seconds: that look serves both), once when a round's grace window ends, on every turn
        while a round holds contributions short of its quorum (a barrier waits for every node, paced by the
        courier's backoff), and look_seconds after the last look."""
        ends, waiting = {}, False
        for fragment, (version, *_) in versions.items():
            current = open_rounds.get(fragment)
            if current is None or current.round != version + 1 or not (current.accepted or current.rejected):
                continue
            if current.quorum_at is None or not current.accepted:  # short of its quorum, or all rejected
                waiting = True
                continue
            steps = [record["step_seconds"] for record in current.accepted.values()]
            ends[(fragment, current.round)] = current.quorum_at + rounds_.grace_seconds(self.rounds, steps)
        self.ended &= set(ends)
        self._ending = [key for key, end in ends.items() if end <= now + SLACK and key not in self.ended]
        soon = any(0 < end - now <= self.poll_seconds for end in ends.values())
        idle = now - self.looked_at >= self.look_seconds
        next_look = min([end for end in ends.values() if end > now] + [self.looked_at + self.look_seconds])
        return waiting or bool(self._ending) or (self.own_unlisted and not soon) or idle, next_look
