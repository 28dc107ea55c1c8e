"""Garbage collection keeps exactly what joiners and a new merger may need: the blobs of each fragment's
newest KEEP_COMMITS commits and the run's initial blobs; round folders go once their round is merged."""

import slowlink as sl
from slowlink.protocol import keys, records
from slowlink.protocol.run import KEEP_COMMITS, read_commit, read_head, read_run

from .nodes import run_nodes, tiny_mlp


def test_only_the_newest_commits_blobs_and_the_initial_ones_remain_and_a_joiner_can_use_them():
    mailbox = sl.MemoryMailbox()
    # Momentum and commit_dtype: every commit names three blobs (parameters, outer state, change).
    algorithm = sl.DiLoCo(sync_every=2, fragments=2, quorum_size=2, overlap_steps=0, commit_dtype="BF16")
    run_nodes(2, algorithm, mailbox, 24, lr=0.05)
    head, _ = read_head(mailbox, 2)
    assert min(head) >= 11  # a dozen rounds per fragment: three times over what is kept
    run = read_run(mailbox)
    expected = set(run.initial)
    for fragment in range(2):
        for round_ in range(1, head[fragment] + 1):
            record = read_commit(mailbox, fragment, round_)  # the history itself is never collected
            assert record is not None
            if round_ > head[fragment] - KEEP_COMMITS:
                expected |= {record["params"], record["outer_state"], record["change"]}
    stored = {listing.key.removeprefix("blobs/") for listing in mailbox.list("blobs/")}
    assert stored == expected  # nothing needed is gone, nothing else is left
    folders = {listing.key.rsplit("/", 1)[0] + "/" for listing in mailbox.list(keys.ROUNDS)}
    assert folders <= {keys.round_folder(fragment, head[fragment]) for fragment in range(2)}
    joiner = tiny_mlp(seed=5)
    assert sl.align(joiner, mailbox=mailbox) == {0: head[0], 1: head[1]}


def test_joining_costs_the_same_requests_after_3_rounds_as_after_30():
    from slowlink.mailbox.metered import Metered

    costs = {}
    for rounds in (3, 30):
        mailbox = sl.MemoryMailbox()
        run_nodes(1, sl.DiLoCo(sync_every=1, fragments=1, overlap_steps=0), mailbox, rounds)
        counted = Metered(mailbox)
        assert sl.align(tiny_mlp(seed=5), mailbox=counted) == {0: rounds}
        costs[rounds] = dict(counted.requests)
    # run.json, head.json, a probe for a commit head.json does not name yet, the newest commit and its blob:
    # nothing that grows with the run.
    assert costs[3] == costs[30] == {"GET": 5}


def test_a_joiner_finds_a_commit_that_head_json_does_not_name_yet():
    # A merger that died between writing commit 3 and naming it in head.json, with no leader left to repair it.
    mailbox = sl.MemoryMailbox()
    run_nodes(1, sl.DiLoCo(sync_every=1, overlap_steps=0), mailbox, 3)
    mailbox.put(keys.HEAD, records.encode({"versions": [2]}))
    assert sl.align(tiny_mlp(seed=5), mailbox=mailbox) == {0: 3}
