"""What session.step(samples=...) takes, and a contribution no merger would take refused before it is
published: a round whose every contribution is rejected never commits, and its node would wait on it."""

import threading
import time

import numpy as np
import pytest
import torch

import slowlink as sl

from .nodes import batches, sgd_step, tiny_mlp


def session(mailbox=None, **options):
    algorithm = options.pop("algorithm", sl.DiLoCo(sync_every=2, overlap_steps=0))
    return sl.Session(tiny_mlp(), algorithm=algorithm, mailbox=mailbox or sl.MemoryMailbox(), node_id="n",
                      poll_seconds=0.005, **options)  # fmt: skip


@pytest.mark.parametrize(
    "samples", [np.int64(8), np.int32(8), np.uint8(8), torch.tensor(8), torch.tensor([8])], ids=repr
)
def test_integers_of_numpy_and_torch_count_as_samples(samples):
    with session() as node:
        node.step(samples=samples)
        node.step(samples=samples)
        assert node.stats.samples == 16 and type(node.node.state.samples) is int


@pytest.mark.parametrize(
    "samples",
    [
        True,
        np.True_,
        torch.tensor(True),
        -1,
        np.int64(-3),
        torch.tensor(-2),
        8.0,
        torch.tensor(8.0),
        "8",
        None,
    ],
    ids=repr,
)
def test_flags_negatives_and_non_integers_are_refused(samples):
    with session() as node:
        with pytest.raises(sl.ConfigError, match=r"samples must be a non-negative integer"):
            node.step(samples=samples)
        assert node.stats.step == 0


def test_a_sync_whose_steps_reported_no_samples_is_refused_at_the_step_that_would_publish_it():
    # The case: samples=0 reported on the first steps. Published, the contribution was rejected, the
    # round never committed, every later sync was deferred and leaving waited the whole close_timeout.
    with session(close_timeout=1.0) as node:
        node.step(samples=0)
        with pytest.raises(
            sl.ConfigError, match=r"2 steps that reported 0 samples.*session.step\(samples=len"
        ):
            node.step(samples=0)
        assert node.node.state.in_flight() == 0 and node.stats.contributions_sent == 0
        started = time.monotonic()
    assert time.monotonic() - started < 1.0  # nothing in flight to wait for


def test_steps_without_samples_ride_with_steps_that_have_some():
    model = tiny_mlp()
    with sl.Session(model, algorithm=sl.DiLoCo(sync_every=2, overlap_steps=0), mailbox=sl.MemoryMailbox(),
                    node_id="n", poll_seconds=0.005) as node:  # fmt: skip
        for step, batch in enumerate(batches(0, 4)):
            sgd_step(model, batch, 0.1)
            node.step(samples=0 if step % 2 == 0 else 4)
    assert node.stats.commits_applied == 2 and node.stats.contributions_rejected == 0


def test_leaving_with_flush_on_close_leaves_out_steps_without_samples_and_says_they_were_dropped():
    events = []
    algorithm = sl.DiLoCo(sync_every=4, flush_on_close=True)
    with session(algorithm=algorithm, close_timeout=5.0, on_event=events.append) as node:
        node.step(samples=0)
        started = time.monotonic()
    assert time.monotonic() - started < 1.0
    assert [e.data["steps"] for e in events if e.kind == "steps_dropped"] == [1]


def test_a_node_whose_contribution_is_rejected_carries_its_steps_into_the_next_and_publishes_again():
    """A commit without this node's contribution frees its in-flight slot and carries the steps on."""
    mailbox = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=2, overlap_steps=0, grace_seconds=30.0)
    models, seen = [tiny_mlp(), tiny_mlp()], []
    with sl.Session(models[0], algorithm=algorithm, mailbox=mailbox, node_id="good",
                    poll_seconds=0.005) as good:  # fmt: skip
        deadline = time.monotonic() + 10
        while not good.courier.leadership.is_leader and time.monotonic() < deadline:
            time.sleep(0.005)
        with sl.Session(models[1], algorithm=algorithm, mailbox=mailbox, node_id="blown", poll_seconds=0.005,
                        on_event=seen.append) as blown:  # fmt: skip
            for _round in range(2):
                for step in range(2):
                    sgd_step(models[0], batches(0, 1)[0], 0.1)
                    sgd_step(models[1], batches(1, 1)[0], 0.1)
                    if step == 1:
                        with torch.no_grad():  # a Δ a hundred times the parameters: max_norm_ratio rejects it
                            for p in models[1].parameters():
                                p.mul_(100.0)
                    # Side by side: each sync waits for its round, which closes once both nodes reported.
                    thread = threading.Thread(target=good.step, kwargs={"samples": 4})
                    thread.start()
                    blown.step(samples=4)
                    thread.join(timeout=30)
    # The node is told its contribution was rejected, and why (the commit record names it).
    late = [(e.data["round"], e.data["steps"]) for e in seen if e.kind == "own_contribution_rejected"]
    assert all("norm" in e.data["reason"] for e in seen if e.kind == "own_contribution_rejected")
    sent = [(e.data["round"], e.data["steps"]) for e in seen if e.kind == "contribution_sent"]
    assert late[:1] == [(1, 2)] and sent[:2] == [(1, 2), (2, 4)]  # round 2 carries round 1's steps
    # Round 2 was rejected too: its 4 steps were carried again and, on leaving, reported as never merged.
    assert blown.stats.steps_dropped == 4 and good.stats.contributions_rejected == 2
