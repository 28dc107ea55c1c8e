"""A merger that dies is replaced: with lease_seconds=5 the next commit lands within one lease plus one
round of the crash, and the commits stay one unbroken sequence."""

import time

import torch

import slowlink as sl
from slowlink.protocol.run import newest_versions, read_commit

from .nodes import batches, sgd_step, tiny_mlp

LEASE = 5.0


def crash(session: sl.Session) -> None:
    """Stop a node's communication thread dead, as a killed process would: no release, no lease removed."""
    session.courier._stopping.set()
    session.courier.wake.set()
    session.courier._thread.join()


def test_a_crashed_merger_is_replaced_within_one_lease_plus_one_round():
    mailbox = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=2, fragments=2)
    models = [tiny_mlp(), tiny_mlp()]
    data = [batches(0, 4000), batches(1, 4000)]
    options = {"algorithm": algorithm, "mailbox": mailbox, "poll_seconds": 0.01, "lease_seconds": LEASE}
    merger = sl.Session(models[0], node_id="merger", close_timeout=0.5, **options).__enter__()
    survivor = sl.Session(models[1], node_id="survivor", **options).__enter__()
    step = 0

    def train_both(until) -> None:
        nonlocal step
        while not until():
            for session, model, batches_ in ((merger, models[0], data[0]), (survivor, models[1], data[1])):
                if session is merger and crashed:
                    continue
                sgd_step(model, batches_[step], 0.05)
                session.step(samples=4)
            step += 1
            time.sleep(0.01)  # a round takes two steps: about 30 ms here

    crashed = False
    train_both(lambda: sum(newest_versions(mailbox, 2)) >= 6)
    assert merger.stats.is_leader and survivor.stats.rounds_merged == 0
    crashed, crashed_at = True, time.monotonic()
    crash(merger)
    versions = newest_versions(mailbox, 2)
    train_both(lambda: newest_versions(mailbox, 2) != versions)
    took = time.monotonic() - crashed_at
    print(f"next commit {took:.2f} s after the merger crashed (lease {LEASE} s)")
    round_seconds = 1.0  # two steps and a few polls, with room for a busy machine
    # Not before the lease ran out: it runs from the merger's last renewal, at most a quarter lease before.
    assert LEASE * 0.75 - 0.1 <= took <= LEASE + round_seconds + 1.0, took
    assert survivor.stats.is_leader
    train_both(lambda: survivor.stats.rounds_merged >= 4)  # and it keeps merging
    survivor.__exit__(None, None, None)
    merger.__exit__(None, None, None)
    final = newest_versions(mailbox, 2)
    for fragment in range(2):  # commit records are the history: one unbroken sequence, whoever merged
        records = [read_commit(mailbox, fragment, r) for r in range(1, final[fragment] + 1)]
        assert all(record is not None for record in records)
        assert {record["merger"] for record in records} == {"merger", "survivor"}
    assert all(torch.isfinite(p).all() for p in models[1].parameters())
