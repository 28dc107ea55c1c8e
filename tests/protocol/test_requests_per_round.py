"""What a round costs in requests, by kind: the merger reads each learner's contribution once and its own
not at all, moves head.json (a hint) every few commits with one PUT on the etag it last wrote, reads it only a quarter lease apart, and folds
the summary and deletes garbage every few seconds, not per commit; a learner probes for the commit it awaits
and reads each commit once. benchmarks/s3_requests.py
gives the totals over S3; this pins the structure, which a regression would break."""

import threading
import time

import slowlink as sl
from slowlink.protocol.run import HEAD_EVERY
from tests.session.nodes import batches, sgd_step, tiny_mlp


def test_a_commit_costs_the_merger_no_summary_or_garbage_requests_and_a_learner_one_read():
    store = sl.MemoryMailbox()
    counts = [None, None]  # each node's requests by verb and kind of key, as its Session counted them
    algorithm = sl.DiLoCo(sync_every=4, fragments=2, quorum_size=2, overlap_steps=0)
    stats, errors, barrier = [None, None], [], threading.Barrier(2)

    def node(i: int) -> None:
        try:
            model = tiny_mlp()
            with sl.Session(model, algorithm=algorithm, mailbox=store, node_id=f"node-{i}",
                            poll_seconds=0.005) as session:  # fmt: skip
                barrier.wait()
                for batch in batches(i, 40):
                    sgd_step(model, batch, 0.1)
                    session.step(samples=len(batch[0]))
            stats[i], counts[i] = session.stats, session.mailbox.kinds
        except BaseException as error:
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    merger = max(range(2), key=lambda i: stats[i].rounds_merged)
    learner = 1 - merger
    commits = stats[merger].rounds_merged
    assert commits >= 18 and stats[learner].rounds_merged == 0  # 20 rounds, one merger throughout
    mine, theirs = counts[merger], counts[learner]
    # Each of the learner's contributions is read once, the merger's own not at all: it keeps them in memory
    # and never writes them, as it never hands over its lead here (test_merger_own covers a hand-over).
    # A contribution is one object: one PUT to publish it, one GET to read it whole.
    assert mine["PUT rounds/"] == 0 and theirs["PUT rounds/"] == stats[learner].contributions_sent
    # A commit of the tiny model carries its parameters and the outer state in its record, and run.json the
    # initial model (records.INLINE_BYTES): no node writes or reads a blob.
    assert mine["PUT blobs/"] == theirs["PUT blobs/"] == mine["GET blobs/"] == theirs["GET blobs/"] == 0
    # Joining: one node claims the creation and writes run.json; the other waits on the claim with a few
    # reads of run.json.
    creator, joiner = (mine, theirs) if mine["PUT run.json"] else (theirs, mine)
    assert creator["PUT run.json"] == creator["PUT creating.json"] == 1
    assert joiner["PUT run.json"] == joiner["PUT creating.json"] == 0 and joiner["GET run.json"] <= 3
    merged = stats[learner].contributions_sent - stats[learner].contributions_late
    # A look lists rounds/ once a round is under way (what any node wrote to it by then is judged), then
    # reads the one contribution it waits for by its key: at most one request, as a LIST, and a hit needs no
    # GET after it. The old code listed rounds/ on each of about 70 turns spent waiting.
    assert merged <= mine["GET rounds/"] and mine["LIST rounds/"] <= commits + 6
    assert (
        mine["PUT head.json"] <= commits // HEAD_EVERY + 1
    )  # a hint, moved every few commits and on leaving
    assert (
        mine["GET head.json"] <= 3
    )  # joining, being elected, and a look a quarter lease apart (another merger?)
    # Summary and garbage: folded and deleted when the node leaves (the run is shorter than TIDY_SECONDS),
    # from what the merger knows, without listing blobs or reading the commits back.
    assert mine["PUT summary.json"] == 1 and mine["LIST blobs/"] == 0
    assert mine["DELETE blobs/"] + mine["DELETE rounds/"] <= 2
    assert mine["GET commits/"] <= 8  # joining, being elected and leaving look for commits head.json misses
    # The learner probes for the commit its contribution awaits (a miss is a 404) instead of polling
    # head.json, which it reads a quarter lease apart; it reads each commit's record once, which holds the
    # parameters.
    assert theirs["GET head.json"] <= 2
    assert theirs["GET commits/"] <= 3 * stats[learner].commits_applied + 4


def test_reading_the_leases_rarely_does_not_keep_a_round_waiting_for_a_node_that_left():
    # Leases are read a quarter lease apart (30 s here); a round waiting for a node reads them again within
    # a couple of seconds, so the node that left is not waited for until the next quarter lease.
    store = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=2, quorum_size=2, flush_on_close=True)  # no barrier: a.step() returns
    options = {"algorithm": algorithm, "mailbox": store, "poll_seconds": 0.005, "lease_seconds": 120.0}
    model = tiny_mlp()
    with sl.Session(model, node_id="a", close_timeout=8.0, **options) as a:
        with sl.Session(tiny_mlp(), node_id="b", **options):
            for batch in batches(0, 2):  # a's round 1 is in, and it waits for b, whose lease it has read
                sgd_step(model, batch, 0.1)
                a.step(samples=len(batch[0]))
            deadline = threading.Event()
            while a.courier.leases.reads < 2 and not deadline.wait(0.01):
                pass
        # b left without contributing; a leaves too, waiting at most close_timeout for its round
    assert a.stats.steps_dropped == 0 and a.stats.commits_applied == 1


def test_the_merger_lists_rounds_only_when_one_can_be_due_and_a_follower_watches_the_leader_only_when_late():
    # Defaults (quorum 1, a grace window), two nodes stepping every 10 ms, turns as often as every 5 ms:
    # the merger lists rounds/ when its own contribution is in, when a grace window ends, and about once
    # a sync, not every turn; a follower reads leader.json only when the commit it awaits is overdue,
    # not every couple of seconds.
    store = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=10, fragments=2)
    stats, counts, errors, barrier = [None, None], [None, None], [], threading.Barrier(2)

    def node(i: int) -> None:
        try:
            model = tiny_mlp()
            with sl.Session(model, algorithm=algorithm, mailbox=store, node_id=f"node-{i}",
                            poll_seconds=0.005) as session:  # fmt: skip
                barrier.wait()
                for batch in batches(i, 250):
                    started = time.perf_counter()
                    sgd_step(model, batch, 0.1)
                    time.sleep(max(0.0, 0.01 - (time.perf_counter() - started)))
                    session.step(samples=len(batch[0]))
            stats[i], counts[i] = session.stats, session.mailbox.kinds
        except BaseException as error:
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    merger = max(range(2), key=lambda i: stats[i].rounds_merged)
    commits = stats[merger].rounds_merged
    assert commits >= 40  # 250 / 10 × 2 = 50 scheduled rounds
    mine, theirs = counts[merger], counts[1 - merger]
    # Turns come every few ms after news; listing on each would cost several LISTs per commit.
    assert mine["LIST rounds/"] <= 2 * commits + 4
    assert theirs["GET leader.json"] <= 2
