"""Garbage collection keeps exactly what joiners and a new merger may need: the blobs each fragment's newest
KEEP_COMMITS commits are rebuilt from (their snapshot and the changes since) and the run's initial blobs;
round folders go once their round is merged."""

import pytest
import torch

import slowlink as sl
from slowlink.protocol import keys, records
from slowlink.protocol.run import KEEP_COMMITS, read_commit, read_head, read_run

from .nodes import run_nodes, tiny_mlp

pytestmark = pytest.mark.usefixtures("blobs_apart")  # blobs as a large model's, the tiny model's included


def stored_blobs(record: dict) -> set[str]:
    """The blobs a commit record needs: its change, its parameters in a snapshot, and the outer state it
    names (written with it or with an earlier commit)."""
    fields = (
        ("params", "outer_state", "change") if record.get("snapshot", True) else ("outer_state", "change")
    )
    return {record[field] for field in fields if record[field]}


@pytest.mark.parametrize(
    ("options", "snapshots"),
    [
        # float32 commits: every commit is a snapshot of parameters and outer state, and carries no change.
        pytest.param({}, "every", id="F32: every commit a snapshot"),
        # BF16 commits: the change every round, a snapshot every 4 rounds; chains must stay whole.
        pytest.param({"commit_dtype": "BF16", "snapshot_every": 4}, "some", id="BF16: a snapshot every 4"),
    ],
)
def test_only_the_blobs_the_newest_commits_rebuild_from_remain_and_a_joiner_can_use_them(options, snapshots):
    mailbox = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=2, fragments=2, quorum_size=2, overlap_steps=0, **options)
    run_nodes(2, algorithm, mailbox, 36, lr=0.05)
    head, _ = read_head(mailbox, 2)
    assert min(head) >= 17  # rounds enough for several snapshot intervals, all but the newest collected
    run = read_run(mailbox)
    expected = set(run.initial)
    for fragment in range(2):
        history = [read_commit(mailbox, fragment, round_) for round_ in range(1, head[fragment] + 1)]
        assert all(record is not None for record in history)  # the history itself is never collected
        flags = [record.get("snapshot", True) for record in history]
        assert all(flags) if snapshots == "every" else 2 < sum(flags) < len(flags)
        # Every commit from the newest snapshot at or before the oldest kept commit is needed.
        oldest_kept = head[fragment] - KEEP_COMMITS + 1
        start = max(round_ for round_ in range(1, oldest_kept + 1) if flags[round_ - 1])
        for record in history[start - 1 :]:
            expected |= stored_blobs(record)
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


def test_with_light_commits_joining_reads_at_most_one_snapshot_interval_of_changes_however_long_the_run():
    from slowlink.mailbox.metered import Metered

    costs = {}
    for rounds in (5, 50):
        mailbox = sl.MemoryMailbox()
        algorithm = sl.DiLoCo(sync_every=1, overlap_steps=0, delta_dtype="F4", snapshot_every=8)
        models, _ = run_nodes(1, algorithm, mailbox, rounds)
        counted = Metered(mailbox)
        joiner = tiny_mlp(seed=5)
        assert sl.align(joiner, mailbox=counted) == {0: rounds}
        assert all(
            torch.equal(a, b) for a, b in zip(joiner.parameters(), models[0].parameters(), strict=True)
        )
        costs[rounds] = counted.requests["GET"]
    # run.json, head.json, the probe, then from the newest snapshot (or the initial model) one commit record
    # and one change per round: at most snapshot_every of them, however long the run.
    assert costs[5] == 4 + 2 * 5
    assert costs[50] <= 4 + 2 * 8 + 2


def test_a_joiner_finds_a_commit_that_head_json_does_not_name_yet():
    # A merger that died between writing commit 3 and naming it in head.json, with no leader left to repair it.
    mailbox = sl.MemoryMailbox()
    run_nodes(1, sl.DiLoCo(sync_every=1, overlap_steps=0), mailbox, 3)
    mailbox.put(keys.HEAD, records.encode({"versions": [2]}))
    assert sl.align(tiny_mlp(seed=5), mailbox=mailbox) == {0: 3}
