"""A round whose every contribution is rejected still ends: its commit holds no contributor and names the
rejections, so each rejected node learns why, carries its steps on, frees its in-flight slot and leaves
without waiting out close_timeout."""

import threading
import time

import torch

import slowlink as sl
from slowlink.protocol.run import read_commit

from .nodes import batches, sgd_step, tiny_mlp


def wait_for(condition, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen"
        time.sleep(0.005)


def test_a_round_whose_every_contribution_is_rejected_commits_empty_and_its_nodes_carry_their_steps_on(
    tmp_path,
):
    # The issue's case, with a reason other than samples=0: both nodes' round-1 contributions are rejected
    # by the merger (each Δ is over a hundred times the parameters it moves). Before, round 1 never committed:
    # the in-flight slot stayed taken, every later sync was deferred and leaving waited close_timeout.
    mailbox = sl.DirMailbox(tmp_path / "run")
    algorithm = sl.DiLoCo(sync_every=2)  # the defaults: quorum 1, no barrier
    models, seen = [tiny_mlp(), tiny_mlp()], [[], []]
    data = [batches(0, 6), batches(1, 6)]
    options = dict(algorithm=algorithm, mailbox=mailbox, poll_seconds=0.005, close_timeout=5.0)
    with sl.Session(models[0], node_id="a", on_event=seen[0].append, **options) as a:
        wait_for(lambda: a.courier.leadership.is_leader, "a taking the leadership")
        with sl.Session(models[1], node_id="b", on_event=seen[1].append, **options) as b:
            sessions = (a, b)
            for round_ in (1, 2, 3):
                for step in (0, 1):
                    for i, session in enumerate(sessions):
                        sgd_step(models[i], data[i][2 * (round_ - 1) + step], 0.1)
                        blown = round_ == 1 and step == 1
                        with torch.no_grad():
                            for p in models[i].parameters() if blown else ():
                                p.mul_(
                                    128.0
                                )  # only in the snapshot this step takes (a power of 2: undone exactly)
                        session.step(samples=4)
                        with torch.no_grad():
                            for p in models[i].parameters() if blown else ():
                                p.div_(128.0)
                # Each round's commit reaches both nodes before the next sync, so that no sync is deferred.
                wait_for(
                    lambda r=round_: all(s.courier.latest[0][0] >= r for s in sessions), f"round {round_}"
                )
    empty = read_commit(mailbox, 0, 1)
    assert empty["contributors"] == [] and [r["node"] for r in empty["rejected"]] == ["a", "b"]
    assert all("times the fragment's own norm" in r["reason"] for r in empty["rejected"])
    for round_ in (2, 3):
        assert [c["node"] for c in read_commit(mailbox, 0, round_)["contributors"]] == ["a", "b"]
    for session, events in zip((a, b), seen, strict=True):
        told = [e for e in events if e.kind == "own_contribution_rejected"]
        assert [(e.data["fragment"], e.data["round"], e.data["steps"]) for e in told] == [(0, 1, 2)]
        assert "times the fragment's own norm" in told[0].data["reason"]
        sent = [(e.data["round"], e.data["steps"]) for e in events if e.kind == "contribution_sent"]
        assert sent == [(1, 2), (2, 4), (3, 2)]  # round 2 carries round 1's steps
        stats = session.stats
        assert stats.own_contributions_rejected == 1 and stats.contributions_late == 0
        assert stats.syncs_deferred == 0 and stats.steps_dropped == 0
        assert stats.steps_unconfirmed == 0  # leaving found nothing in flight: it did not wait close_timeout
        assert stats.versions == (3,)
    assert a.stats.contributions_rejected == 2  # the merger's own count: both of round 1
    for left, right in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(left, right) and torch.isfinite(left).all()


def test_a_lone_node_whose_contribution_is_rejected_goes_on_committing(tmp_path):
    mailbox = sl.DirMailbox(tmp_path / "run")
    model, seen = tiny_mlp(), []
    with sl.Session(model, algorithm=sl.DiLoCo(sync_every=2, outer_lr=1.0, outer_momentum=0.0),
                    mailbox=mailbox, node_id="n", poll_seconds=0.005, close_timeout=5.0,
                    on_event=seen.append) as session:  # fmt: skip
        for step, batch in enumerate(batches(0, 4)):
            sgd_step(model, batch, 0.1)
            with torch.no_grad():
                for p in model.parameters() if step == 1 else ():
                    p.mul_(1024.0)  # in the snapshot only, as above
            session.step(samples=4)
            with torch.no_grad():
                for p in model.parameters() if step == 1 else ():
                    p.div_(1024.0)
            wait_for(
                lambda s=step: session.courier.latest[0][0] >= (s + 1) // 2, f"the commit after step {step}"
            )
    assert read_commit(mailbox, 0, 1)["contributors"] == []
    assert [c["steps"] for c in read_commit(mailbox, 0, 2)["contributors"]] == [4]
    assert session.stats.own_contributions_rejected == 1 and session.stats.steps_unconfirmed == 0
    # The empty commit moved nothing, and round 2 (outer lr 1, no momentum) holds all four steps: the model
    # is where plain local SGD takes it.
    reference = tiny_mlp()
    for batch in batches(0, 4):
        sgd_step(reference, batch, 0.1)
    for mine, plain in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(mine, plain, atol=1e-6)


def test_a_final_contribution_the_merger_rejects_is_sent_once_not_until_close_timeout(tmp_path):
    # Found under load: a leaving node's flushed contribution was rejected for its norm, came back unchanged
    # and went out again, round after round, until close_timeout. Here b has no merged contribution of its
    # own yet (so its own check lets anything out), and its one step is far larger than the fragment's
    # history: the merger, a, which trains on meanwhile, rejects it.
    mailbox = sl.DirMailbox(tmp_path / "run")
    options = dict(algorithm=sl.DiLoCo(sync_every=2, flush_on_close=True), mailbox=mailbox, poll_seconds=0.005,
                   close_timeout=5.0)  # fmt: skip
    models, seen, data = [tiny_mlp(), tiny_mlp()], [], batches(0, 400)
    done = threading.Event()
    with sl.Session(models[0], node_id="a", **options) as a:

        def train_a() -> None:
            for step in range(400):
                if done.is_set():
                    return
                sgd_step(models[0], data[step], 0.01)
                a.step(samples=4)
                time.sleep(0.01)

        for step in range(4):  # two rounds commit: the merger learns the fragment's norms
            sgd_step(models[0], data[step], 0.01)
            a.step(samples=4)
            wait_for(lambda r=(step + 1) // 2: a.courier.latest[0][0] >= r, f"round {(step + 1) // 2}")
        trainer = threading.Thread(target=train_a)
        trainer.start()
        try:
            with sl.Session(models[1], node_id="b", on_event=seen.append, **options) as b:
                with torch.no_grad():
                    for p in models[1].parameters():
                        p.add_(1000.0)
                b.step(samples=4)
                started = time.monotonic()
            left_after = time.monotonic() - started
        finally:
            done.set()
            trainer.join()
    assert left_after < 4.0  # b left without waiting out close_timeout
    rejected = [e for e in seen if e.kind == "own_contribution_rejected"]
    assert len(rejected) == 1, [e.message for e in rejected]
    assert b.stats.own_contributions_rejected == 1 and b.stats.steps_dropped == 1
