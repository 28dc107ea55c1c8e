"""Leaving a run costs a few requests and leaves it consistent: head.json names the newest commits, the
leadership is released, no lease is left, and the node that left last holds the newest commits. The merger
probes for commits head.json does not name only where one of its turns failed and may have left one."""

from __future__ import annotations

import threading
import time
from collections import Counter

import slowlink as sl
from slowlink.errors import MailboxUnavailable
from slowlink.protocol import keys, records
from slowlink.protocol.courier import Courier
from slowlink.protocol.run import newest_versions, read_head

from .nodes import batches, sgd_step, tiny_mlp


def record_leaving_requests(monkeypatch) -> dict[str, tuple[bool, Counter, int]]:
    """node id -> (whether it led as it left, the requests its Courier.stop made: the thread's stop, the
    merger's leave, the lease; how many times it probed for commits its view lacks)."""
    spent, real_stop = {}, Courier.stop

    def stop(self: Courier) -> None:
        before, leading, probes, recover = (
            Counter(self.mailbox.kinds),
            self.leadership.is_leader,
            [],
            self._recover_head,
        )
        self._recover_head = lambda: (probes.append(1), recover())
        try:
            real_stop(self)
        finally:
            spent[self.node_id] = leading, Counter(self.mailbox.kinds) - before, len(probes)

    monkeypatch.setattr(Courier, "stop", stop)
    return spent


def train(
    mailbox, node: int, steps: int, sessions: list, barrier: threading.Barrier | None, **options
) -> None:
    model = tiny_mlp()
    algorithm = sl.DiLoCo(sync_every=4, fragments=2)  # the defaults: quorum 1, no barrier
    with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id=f"node-{node}", poll_seconds=0.01,
                    **options) as session:  # fmt: skip
        if barrier is not None:
            barrier.wait()
        for batch in batches(node, steps):
            sgd_step(model, batch, 0.05)
            time.sleep(0.01)  # rounds commit one by one, as in a real run
            session.step(samples=len(batch[0]))
    sessions[node] = session


def assert_consistent(mailbox, versions_of_nodes: list[list[int]]) -> None:
    newest = newest_versions(mailbox, 2)
    assert read_head(mailbox, 2)[0] == newest  # head.json names the newest readable commits
    assert max(versions_of_nodes, key=sum) == newest  # the node that left last holds them
    leader = records.decode(mailbox.get(keys.LEADER).data, records.LEADER_FIELDS, what=keys.LEADER)
    assert leader["node"] == ""  # released: a node that joins next leads at once
    assert mailbox.list("nodes/") == []  # nobody waits a lease for a node that left
    assert sl.align(tiny_mlp(seed=3), mailbox=mailbox) == dict(enumerate(newest))


def test_two_nodes_leave_in_a_few_requests_without_probing_and_leave_the_run_consistent(monkeypatch):
    spent = record_leaving_requests(monkeypatch)
    mailbox, sessions, barrier = sl.MemoryMailbox(), [None, None], threading.Barrier(2)
    threads = [
        threading.Thread(target=train, args=(mailbox, node, 40, sessions, barrier)) for node in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(session is not None for session in sessions)
    assert_consistent(mailbox, [list(session.stats.versions) for session in sessions])
    assert sum(session.stats.rounds_merged for session in sessions) >= 15  # 40 steps, H=4, 2 fragments
    assert any(leading for leading, _, _ in spent.values())
    for node, (leading, requests, probes) in spent.items():
        assert probes == 0, node  # no probe for commits its view lacks: no turn of it failed
        # A merger: head.json, rounds/ listed, summary.json read and written, the garbage, leader.json;
        # everyone: its lease. (The second to leave may have taken the leadership the first released: it
        # then reads the records of older commits it never held, to know their garbage.)
        others = sum(requests.values()) - requests["GET commits/"]
        assert others <= (7 if leading else 1), (node, requests)
        assert requests["GET commits/"] == 0 or leading
        assert requests["DELETE nodes/"] == 1


class HeadFailsOnce(sl.MemoryMailbox):
    """The first write of head.json fails, as a store's 503 would, after the commit it names was written."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def put(self, key: str, data: bytes, **options) -> str:
        if key == keys.HEAD and not self.failed:
            self.failed = True
            raise MailboxUnavailable("PUT head.json failed 8 times (injected)")
        return super().put(key, data, **options)


def test_a_merger_whose_turn_failed_after_a_commit_names_that_commit_when_it_leaves(monkeypatch):
    spent = record_leaving_requests(monkeypatch)
    mailbox, sessions = HeadFailsOnce(), [None]
    errors = []
    train(mailbox, 0, 24, sessions, None, close_timeout=1.0, on_event=lambda event: errors.append(event)
          if event.kind == "mailbox_error" else None)  # fmt: skip
    assert mailbox.failed and errors  # a commit's turn failed at its head.json write (HEAD_EVERY commits)
    newest = newest_versions(mailbox, 2)
    assert min(newest) >= 4
    assert_consistent(mailbox, [list(sessions[0].stats.versions)])
    assert spent["node-0"][2] == 1  # it probed for the commits it may have left unnamed


def test_a_leaving_merger_tidies_once_as_it_leaves_not_between_its_last_commits():
    from slowlink.mailbox.metered import Metered
    from slowlink.protocol.housekeeping import TIDY_SECONDS, Housekeeping

    mailbox, now = Metered(sl.MemoryMailbox()), [0.0]
    housekeeping = Housekeeping(mailbox, 2, "node-0", lambda event: None, lambda: now[0])
    garbage = keys.blob("ab" * 32)
    mailbox.put(garbage, b"an old commit's blob")
    housekeeping.garbage.add(garbage)
    now[0] = TIDY_SECONDS + 1  # a tidy is due
    housekeeping.leaving = True
    before = sum(mailbox.kinds.values())
    housekeeping.tidy()  # a commit while leaving: its requests stay off the path of the rounds awaited
    assert sum(mailbox.kinds.values()) == before and mailbox.get(garbage) is not None
    housekeeping.tidy([0, 0])  # the leave itself
    assert mailbox.get(garbage) is None and housekeeping.garbage == set()
