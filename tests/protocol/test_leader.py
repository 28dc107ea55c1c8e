"""Leadership over a store that loses answers: a renewal that landed though its answer was lost keeps
the leader's term, while a real takeover after a lease is still noticed as lost."""

import pytest

from slowlink.errors import MailboxUnavailable
from slowlink.mailbox.memory import MemoryMailbox
from slowlink.protocol import keys, records
from slowlink.protocol.leader import Leadership


class Clock:
    """A monotonic clock that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class LosesAnswers(MemoryMailbox):
    """Applies every write; the next `lose` writes of leader.json then fail as if their answer was lost."""

    def __init__(self) -> None:
        super().__init__()
        self.lose = 0

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        etag = super().put(key, data, if_absent=if_absent, if_match=if_match)
        if key == keys.LEADER and self.lose:
            self.lose -= 1
            raise MailboxUnavailable("injected: PUT leader.json applied, its answer lost")
        return etag


def leader_record(store: MemoryMailbox) -> dict:
    return records.decode(store.get(keys.LEADER).data, records.LEADER_FIELDS, what=keys.LEADER)


def test_a_renewal_that_landed_with_its_answer_lost_keeps_the_leader_and_its_term():
    store, clock = LosesAnswers(), Clock()
    leader = Leadership(store, "a", lease_seconds=4.0, clock=clock)
    assert leader.tick() == "elected" and leader.term == 1
    clock.now += 1.0  # a renewal is due every lease / 4
    store.lose = 1
    with pytest.raises(MailboxUnavailable):
        leader.tick()  # beat 2 is in the store; the leader still holds beat 1's etag
    assert leader_record(store)["beat"] == 2
    # The next renewal is refused for its stale etag; leader.json names this node in this term: its own write.
    assert leader.tick() is None
    assert leader.is_leader and leader.term == 1
    clock.now += 1.0
    assert leader.tick() is None  # renewing on the adopted etag works: a newer beat, the same term
    record = leader_record(store)
    assert (record["node"], record["term"]) == ("a", 1) and record["beat"] > 2


def test_a_leader_taken_over_after_a_lease_learns_that_it_lost():
    store, clock_a, clock_b = MemoryMailbox(), Clock(), Clock()
    a = Leadership(store, "a", lease_seconds=4.0, clock=clock_a)
    b = Leadership(store, "b", lease_seconds=4.0, clock=clock_b)
    assert a.tick() == "elected"
    assert b.tick() is None  # b sees a's record and starts timing its lease
    clock_b.now += 4.0  # a's record stayed the same for a whole lease, as b sees it
    assert b.tick() == "elected" and b.term == 2
    clock_a.now += 1.0
    assert a.tick() == "lost" and not a.is_leader
    assert leader_record(store)["node"] == "b"
