"""What a node has done, as `session.stats` reports it: one counter per event that feeds it (docs/events.md).
A plain value, so that the mailbox node, an island's ranks and a checkpoint read the same fields."""

from dataclasses import dataclass


@dataclass(frozen=True)
class SessionStats:
    """A snapshot of what this node has done; counters of work that did not reach the model included.
    Each counter is named after the event that feeds it (docs/events.md)."""

    node: str
    step: int
    samples: int
    versions: tuple[int, ...]  # the commit each fragment is aligned with
    commits_applied: int  # commits this node aligned with
    rounds_merged: int  # rounds this node closed as the leader
    contributions_sent: int
    contributions_late: int  # missed their round; their steps were carried into the next contribution
    contributions_rejected: int  # rejected by this node as the leader, with reasons in the commit records
    own_contributions_rejected: int  # this node's, rejected by the merger; their steps were carried on
    contributions_refused: int  # not published: far outside this node's history (ContributionRefused)
    syncs_deferred: int  # due while the in-flight limit was reached; published later, nothing lost
    syncs_skipped: int  # due for a round already committed (a node joining mid-round); steps carried
    steps_replaced: int  # overlap steps replaced by a commit (mixing keeps a share of them)
    steps_dropped: int  # steps trained but never merged: dropped when the node left
    steps_unconfirmed: int  # published, but not committed before the node left: the run may still merge them
    mailbox_errors: int  # requests to the store that failed (the communication thread tried again)
    uploads_failed: int  # contribution uploads that failed (each sent again, and counted once when it lands)
    stalls: int  # times this node trained alone: no commit for a while, the store failing (on_stall)
    bytes_sent: int
    bytes_received: int
    requests: int
    is_leader: bool
