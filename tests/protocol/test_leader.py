"""Leadership over a store that loses answers: a renewal that landed though its answer was lost keeps
the leader's term, while a real takeover after a lease is still noticed as lost."""

import pytest

from slowlink.errors import MailboxUnavailable
from slowlink.mailbox.contract import Object
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


class CutsAnswers(MemoryMailbox):
    """The store as one node sees it: its next `cut` reads of leader.json come back cut short."""

    def __init__(self, inner: MemoryMailbox) -> None:
        self.inner, self.cut = inner, 0

    def get(
        self, key: str, *, if_none_match: str | None = None, max_bytes: int | None = None
    ) -> Object | None:
        found = self.inner.get(key, if_none_match=if_none_match, max_bytes=max_bytes)
        if key == keys.LEADER and self.cut and found is not None and found.data:
            self.cut -= 1
            return Object(found.data[:10], found.etag)
        return found

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        return self.inner.put(key, data, if_absent=if_absent, if_match=if_match)

    def list(self, prefix: str, *, start_after: str | None = None):
        return self.inner.list(prefix, start_after=start_after)


def test_one_answer_cut_short_does_not_take_over_a_live_leader():
    store, clock_a, clock_b = MemoryMailbox(), Clock(), Clock()
    a = Leadership(store, "a", lease_seconds=4.0, clock=clock_a)
    b_view = CutsAnswers(store)
    b = Leadership(b_view, "b", lease_seconds=4.0, clock=clock_b)
    assert a.tick() == "elected"
    clock_a.now += 1.0
    assert a.tick() is None  # a renews: b will read a changed record
    b_view.cut = 1
    assert b.tick() is None and not b.is_leader  # the record reads whole on a second look
    clock_a.now += 1.0
    assert a.tick() is None and a.is_leader
    assert leader_record(store)["node"] == "a"


def test_a_record_that_fails_every_read_is_taken_over_at_once():
    store, clock_a, clock_b = MemoryMailbox(), Clock(), Clock()
    a = Leadership(store, "a", lease_seconds=4.0, clock=clock_a)
    b = Leadership(store, "b", lease_seconds=4.0, clock=clock_b)
    assert a.tick() == "elected"
    assert b.tick() is None  # b reads a's record, term 1
    store.put(keys.LEADER, b"\x00garbled")
    assert b.tick() == "elected" and b.term == 2  # at once, not after a lease
    assert leader_record(store)["node"] == "b"
