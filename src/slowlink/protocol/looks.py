"""When the merger lists rounds/: only when a round can be due, not on every turn of its loop.

Its own contributions it knows without a listing; the others' come at about the same steps (every node
syncs on the same schedule), so one look when its own comes in, a few while a round with its quorum waits
for the others (soon after the quorum, then less and less often, up to the end of its grace window), and
one at least every sync of this node for nodes ahead of it, cost about two requests per round.
"""

from ..algorithms import rounds as rounds_

SLACK = 0.05  # a look due this soon counts as due: the merger's turn comes at its time
# When a round with its quorum looks for the other live nodes' contributions, as shares of its grace window
# after the quorum came. Nodes on one schedule come within a small share of it (they differ by a step or
# two), so the round closes about then, not at the window's end; a node far behind costs a look or two more.
LOOKS_IN_GRACE = (0.125, 0.25, 0.5, 1.0)
# A look reads at most this many contributions by key instead of listing rounds/ (a LIST, then a GET of
# each it shows, costs more), and lists it at least every LIST_SECONDS: for nodes not in the merger's view
# of the leases (one that joined since), nodes ahead of it, and the garbage of merged rounds.
MAX_PROBES = 1  # a look then costs at most the one request a LIST costs, and a hit spares the GET after it
LIST_SECONDS = 10.0
# A merger that leaves waits on its last rounds: after a round's quorum it also looks CLOSING_LOOKS times,
# CLOSING_SECONDS apart, so that its leave ends soon after the others' last contributions come in.
CLOSING_LOOKS, CLOSING_SECONDS = 4, 0.025


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
        self.closing = False  # the node leaves: CLOSING_LOOKS too
        # (fragment, round, index in LOOKS_IN_GRACE then CLOSING_LOOKS) of each look in a grace window served,
        # and those due now
        self.served: set[tuple[int, int, int]] = set()
        self._due_now: list[tuple[int, int, int]] = []

    def own_sent(self) -> None:
        self.own_unlisted = True

    def looked(self, now: float) -> None:
        self.looked_at, self.own_unlisted = now, False
        self.served.update(self._due_now)

    def due(self, now: float, open_rounds: dict, versions: dict) -> tuple[bool, float]:
        """(Whether to list rounds/ now, when the next look is due.) open_rounds: the merger's open round by
        fragment (merger.OpenRound); versions: the fragments it merges now (fragment -> its newest commit, ...).

        Due when this node's own contribution came in since the last look (unless a look in a grace window
        is due within poll_seconds: that look serves both), at each of LOOKS_IN_GRACE in a round's grace
        window (and of the CLOSING_LOOKS after its quorum, when this node leaves), on every turn while a
        round holds contributions short of its quorum (a barrier waits for every node, paced by the
        courier's backoff), and look_seconds after the last look."""
        marks, waiting = self._marks(open_rounds, versions)
        self.served &= set(marks)
        slack = CLOSING_SECONDS / 2 if self.closing else SLACK
        self._due_now = [key for key, at in marks.items() if at <= now + slack and key not in self.served]
        soon = any(0 < at - now <= self.poll_seconds for at in marks.values())
        idle = now - self.looked_at >= self.look_seconds
        due = waiting or bool(self._due_now) or (self.own_unlisted and not soon) or idle
        return due, self.next_look(now, open_rounds, versions, marks)

    def next_look(self, now: float, open_rounds: dict, versions: dict, marks: dict | None = None) -> float:
        """When the next look is due, as `due` gives it; the merger asks again once its look has read
        contributions, for a round that has just got its quorum has marks from now on."""
        marks = self._marks(open_rounds, versions)[0] if marks is None else marks
        return min([at for at in marks.values() if at > now] + [self.looked_at + self.look_seconds])

    def _marks(self, open_rounds: dict, versions: dict) -> tuple[dict, bool]:
        """(When each look in a grace window is due, by (fragment, round, index); whether a round holds
        contributions short of its quorum.)"""
        marks, waiting = {}, False
        for fragment, (version, *_) in versions.items():
            current = open_rounds.get(fragment)
            if current is None or current.round != version + 1 or not (current.accepted or current.rejected):
                continue
            if current.quorum_at is None or not current.accepted:  # short of its quorum, or all rejected
                waiting = True
                continue
            steps = [record["step_seconds"] for record in current.accepted.values()]
            grace = rounds_.grace_seconds(self.rounds, steps)
            for index, share in enumerate(LOOKS_IN_GRACE):
                marks[(fragment, current.round, index)] = current.quorum_at + share * grace
            for index in range(CLOSING_LOOKS if self.closing else 0):
                at = current.quorum_at + (index + 1) * CLOSING_SECONDS
                marks[(fragment, current.round, len(LOOKS_IN_GRACE) + index)] = at
        return marks, waiting

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
