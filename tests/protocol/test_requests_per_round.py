"""What a round costs in requests, by kind: the merger reads each learner's contribution once and its own
not at all, moves head.json with one PUT on the etag it last wrote, reads it only once a beat, and folds
the summary and deletes garbage every few seconds, not per commit; a learner reads each commit once. benchmarks/s3_requests.py
gives the totals over S3; this pins the structure, which a regression would break."""

import threading
from collections import Counter

import slowlink as sl
from tests.session.nodes import batches, sgd_step, tiny_mlp

KINDS = ("rounds/", "commits/", "blobs/", "head.json", "nodes/", "leader.json", "summary.json", "run.json")


class KeyCounter:
    """A node's view of the shared mailbox that counts its requests by verb and kind of key."""

    def __init__(self, inner) -> None:
        self.inner, self.counts = inner, Counter()

    def _count(self, verb: str, key: str) -> None:
        self.counts[f"{verb} {next((kind for kind in KINDS if key.startswith(kind)), 'other')}"] += 1

    def put(self, key, data, **options):
        self._count("PUT", key)
        return self.inner.put(key, data, **options)

    def get(self, key, **options):
        self._count("GET", key)
        return self.inner.get(key, **options)

    def list(self, prefix, **options):
        self._count("LIST", prefix)
        return self.inner.list(prefix, **options)

    def delete(self, keys):
        if keys:
            self._count("DELETE", keys[0])
        return self.inner.delete(keys)

    def clock(self):
        return self.inner.clock()


def test_a_commit_costs_the_merger_one_head_put_and_no_summary_or_garbage_requests_and_a_learner_one_read():
    store = sl.MemoryMailbox()
    views = [KeyCounter(store) for _ in range(2)]
    algorithm = sl.DiLoCo(sync_every=4, fragments=2, quorum_size=2, overlap_steps=0)
    stats, errors, barrier = [None, None], [], threading.Barrier(2)

    def node(i: int) -> None:
        try:
            model = tiny_mlp()
            with sl.Session(model, algorithm=algorithm, mailbox=views[i], node_id=f"node-{i}",
                            poll_seconds=0.005) as session:  # fmt: skip
                barrier.wait()
                for batch in batches(i, 40):
                    sgd_step(model, batch, 0.1)
                    session.step(samples=len(batch[0]))
            stats[i] = session.stats
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
    mine, theirs = views[merger].counts, views[learner].counts
    # Each of the learner's contributions is read once (record and payload), the merger's own not at all
    # (it wrote them: they are in the store for a merger that takes over); a commit moves head.json once.
    assert mine["PUT rounds/"] == 2 * stats[merger].contributions_sent
    merged = stats[learner].contributions_sent - stats[learner].contributions_late
    assert merged <= mine["GET rounds/"] / 2 <= stats[learner].contributions_sent
    assert mine["PUT head.json"] == commits
    assert mine["GET head.json"] <= 4  # joining, and a look once a beat (2 s) to notice another merger
    # Summary and garbage: folded and deleted when the node leaves (the run is shorter than TIDY_SECONDS),
    # from what the merger knows, without listing blobs or reading the commits back.
    assert mine["PUT summary.json"] == 1 and mine["LIST blobs/"] == 0
    assert mine["DELETE blobs/"] + mine["DELETE rounds/"] <= 2
    assert mine["GET commits/"] <= 8  # joining, being elected and leaving look for commits head.json misses
    # The learner reads each commit's record once, and its blob.
    assert theirs["GET commits/"] <= stats[learner].commits_applied + 4  # and a few when joining
    assert theirs["GET blobs/"] <= stats[learner].commits_applied + 2
