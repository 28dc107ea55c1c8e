"""When the merger lists rounds/: only when a round can be due, not on every turn of its loop.

Its own contributions it knows without a listing; the others' come at about the same steps (every node
syncs on the same schedule), so one look when its own comes in, one when a grace window ends, and one at
least every sync of this node for nodes ahead of it, cost about one LIST per round.
"""

from ..algorithms import rounds as rounds_

SLACK = 0.05  # a grace window ending this soon counts as ended: the merger's turn comes at its end
# A look reads at most this many contributions by key instead of listing rounds/ (a LIST, then a GET of
# each it shows, costs more), and lists it at least every LIST_SECONDS: for nodes not in the merger's view
# of the leases (one that joined since), nodes ahead of it, and the garbage of merged rounds.
MAX_PROBES = 1  # a look then costs at most the one request a LIST costs, and a hit spares the GET after it
LIST_SECONDS = 10.0


class Looks:
    def __init__(self, rounds: rounds_.Rounds) -> None:
        self.rounds = rounds
        self.poll_seconds = 0.25  # the courier's: how soon a grace window's end counts as now
        self.look_seconds = (
            2.0  # the longest between two looks: the courier sets it (this node's sync period)
        )
        self.looked_at = self.listed_at = float("-inf")
        self.listed: set[tuple[int, int]] = set()  # (fragment, round) under way when rounds/ was listed
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

    def probes(
        self, now: float, open_rounds: dict, versions: dict, own: set, others: set[str], me: str
    ) -> list | None:
        """The contributions a look reads by key, as (fragment, round, node), instead of listing rounds/;
        None to list it (and the listing is taken as done now). By key: those of the other live nodes
        (`others`, the view at hand) not in yet, to each open round that the merger's own contribution
        (`own`: (fragment, round) keys) or another's is in (the others sync on the same schedule), when
        they are at most MAX_PROBES, each of those rounds was listed once already (what any node, leased
        or not, wrote to it by then is judged), none holds a contribution of a node other than `me` (this
        node) outside `others`, and rounds/ was listed within LIST_SECONDS."""
        wanted, under_way, strangers = [], set(), False
        self.listed = {(q, r) for q, r in self.listed if r > versions.get(q, (r,))[0]}  # open rounds only
        for fragment, (version, *_) in versions.items():
            current, round_ = open_rounds.get(fragment), version + 1
            reported = set()
            if current is not None and current.round == round_:
                reported = set(current.accepted) | set(current.rejected)
                # A writer outside the view of the leases may write more to this round than the first
                # listing caught (it began writing as that listing ran): only a listing finds those.
                strangers |= bool(reported - others - {me})
            if (fragment, round_) in own or reported:
                under_way.add((fragment, round_))
                wanted += [(fragment, round_, node) for node in sorted(others - reported)]
        # No round under way (a node ahead of this one may have begun one), one not listed yet, strangers
        # in one, too many to read, or a while since the last listing: list.
        if (not under_way or not under_way <= self.listed or strangers or len(wanted) > MAX_PROBES
                or now - self.listed_at >= LIST_SECONDS):  # fmt: skip
            self.listed_at = now
            self.listed |= under_way
            return None
        return wanted
