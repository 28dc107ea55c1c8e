"""Writes that land while their answer is lost, or that fail, never make work count twice or stall a run:
a contribution whose record landed unanswered is recognised as merged, and a commit whose head.json update
failed is adopted when the merger tries the round again with other contributions."""

import numpy as np
import pytest
import torch

import slowlink as sl
from slowlink.errors import MailboxUnavailable
from slowlink.events import Event
from slowlink.protocol import contribution, keys
from slowlink.protocol import merger as merger_module
from slowlink.protocol.merger import Merger
from slowlink.protocol.run import open_run, read_commit, read_head
from slowlink.wire import payload

from .nodes import batches, sgd_step, tiny_mlp


class FailOnce(sl.MemoryMailbox):
    """Fails the first PUT of keys matching `which`: after applying it (a lost answer) or before."""

    def __init__(self, which, *, applied: bool) -> None:
        super().__init__()
        self.which, self.applied, self.failed = which, applied, []

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        if self.which(key) and not self.failed:
            self.failed.append(key)
            if self.applied:
                super().put(key, data, if_absent=if_absent, if_match=if_match)
            raise MailboxUnavailable(f"PUT {key}: connection reset (injected)")
        return super().put(key, data, if_absent=if_absent, if_match=if_match)


def test_a_contribution_whose_put_landed_with_its_answer_lost_counts_once():
    mailbox = FailOnce(lambda key: key == keys.contribution(0, 1, "n"), applied=True)
    model, replica = tiny_mlp(), tiny_mlp()
    # One node trains, outer lr 1, no momentum: every commit is its own model, so a step counted twice shows.
    # Another, idle, merges (it joins first): a merger keeps its own contributions rather than write them.
    # adaptive_outer=False: a round with one of the two live nodes takes the whole step, not half of it.
    algorithm = sl.DiLoCo(
        sync_every=2, overlap_steps=0, outer_lr=1.0, outer_momentum=0.0, adaptive_outer=False
    )
    merger = sl.Session(tiny_mlp(), algorithm=algorithm, mailbox=mailbox, node_id="m", poll_seconds=0.005)
    with (
        merger,
        sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="n", poll_seconds=0.005) as session,
    ):
        for batch in batches(0, 6):
            sgd_step(model, batch, 0.1)
            sgd_step(replica, batch, 0.1)
            session.step(samples=4)
    assert mailbox.failed == [keys.contribution(0, 1, "n")]
    assert session.stats.contributions_late == 0 and session.stats.commits_applied == 3
    for ours, plain in zip(model.parameters(), replica.parameters(), strict=True):
        torch.testing.assert_close(ours, plain, atol=1e-6, rtol=0)


SCHEMA = [("w", (4,), "float32")]


def plant(mailbox, run, node: str, value: float) -> None:
    claims = {
        "base": 0,
        "samples": 1,
        "steps": 1,
        "final": False,
        "step_seconds": 0.01,
        "norm": 2.0 * abs(value),
    }
    header = contribution.header(run, 0, 1, node, claims)
    mailbox.put(keys.contribution(0, 1, node), payload.pack({"w": np.full(4, value, np.float32)}, header))


def test_a_commit_whose_head_update_failed_is_adopted_though_the_round_now_holds_more(
    monkeypatch, blobs_apart
):
    monkeypatch.setattr(merger_module, "HEAD_EVERY", 1)  # head.json names every commit: its move can fail
    mailbox = FailOnce(lambda key: key == keys.HEAD, applied=False)
    algorithm = sl.DiLoCo(sync_every=1, outer_lr=1.0, outer_momentum=0.0, grace_seconds=0.0)
    initial = {"w": np.zeros(4, np.float32)}
    run, _ = open_run(mailbox, config=algorithm.to_dict(), schema=SCHEMA, schema_digest="0" * 64,
                      plan=[["w"]], initial=lambda: [initial])  # fmt: skip
    events: list[Event] = []
    merger = Merger(mailbox, run, algorithm, "leader", events.append)
    plant(mailbox, run, "a", 1.0)
    try:
        merger.step({0: (0, initial)}, lambda fresh: {"a"}, [0])
    except MailboxUnavailable:
        pass  # the commit landed; moving head.json failed
    assert mailbox.failed == [keys.HEAD] and read_commit(mailbox, 0, 1) is not None
    assert read_head(mailbox, 1)[0] == [0]
    plant(mailbox, run, "b", 3.0)  # a contribution that came in meanwhile: the leader would now merge two
    merger.step({0: (0, initial)}, lambda fresh: {"a", "b"}, [0])
    assert read_head(mailbox, 1)[0] == [1]  # the existing commit is the round's; head.json now says so
    record = read_commit(mailbox, 0, 1)
    assert [c["node"] for c in record["contributors"]] == ["a"]
    blobs = {listing.key for listing in mailbox.list("blobs/")}
    assert keys.blob(record["params"]) in blobs  # the second attempt deleted only its own blobs


class FailGetOnce(sl.MemoryMailbox):
    """Fails the first GET of one key, once `armed` is set to it."""

    armed: str | None = None

    def get(self, key: str, *, if_none_match: str | None = None, max_bytes: int | None = None):
        if key == self.armed:
            self.armed = None
            raise MailboxUnavailable(f"GET {key}: connection reset (injected)")
        return super().get(key, if_none_match=if_none_match, max_bytes=max_bytes)


def test_a_failed_read_while_learning_a_contributions_fate_loses_neither_the_commit_nor_the_fate(monkeypatch):
    monkeypatch.setattr(merger_module, "HEAD_EVERY", 1)  # head.json names commit 2: n goes straight to it
    from slowlink.protocol.courier import Courier, NodeStatus

    mailbox = FailGetOnce()
    algorithm = sl.DiLoCo(sync_every=1, outer_lr=1.0, outer_momentum=0.0, grace_seconds=0.0)
    initial = {"w": np.zeros(4, np.float32)}
    run, _ = open_run(mailbox, config=algorithm.to_dict(), schema=SCHEMA, schema_digest="0" * 64,
                      plan=[["w"]], initial=lambda: [initial])  # fmt: skip
    merger = Merger(mailbox, run, algorithm, "leader", lambda event: None)
    merger.looks.look_seconds = 0.0  # rounds/ listed at every step, as the Courier does a sync period apart
    plant(mailbox, run, "n", 1.0)  # node n's round-1 contribution, merged into commit 1
    [first] = merger.step({0: (0, initial)}, lambda fresh: {"n"}, [0])
    mine = first.record["contributors"][0]["blob"]
    claims = {"base": 1, "samples": 1, "steps": 1, "final": False, "step_seconds": 0.01, "norm": 4.0}
    header = contribution.header(run, 0, 2, "m", claims)
    mailbox.put(keys.contribution(0, 2, "m"), payload.pack({"w": np.full(4, 2.0, np.float32)}, header))
    merger.step({0: (1, first.params)}, lambda fresh: {"m"}, [1])
    # Node n saw neither commit: it still holds version 0 and awaits its round-1 contribution's fate.
    courier = Courier(mailbox, run, algorithm, "n", {0: (0, initial)}, emit=lambda event: None,
                      status=lambda: NodeStatus(0, 0, 0.0), poll_seconds=1.0, lease_seconds=60.0,
                      compression=None)  # fmt: skip
    courier.sent[0] = (1, mine)
    mailbox.armed = keys.commit(0, 1)  # reading commit 1 (the fate) fails once, after commit 2 was fetched
    with pytest.raises(MailboxUnavailable):
        courier.feed.poll_head(courier.sent)
    assert courier.latest[0][0] == 0 and courier.inbox.empty() and courier.sent == {0: (1, mine)}
    courier.feed.poll_head(courier.sent)  # the next turn delivers it whole
    alignment = courier.inbox.get_nowait()
    assert (alignment.version, alignment.mine) == (2, "merged")
    assert courier.latest[0][0] == 2 and courier.sent == {}
