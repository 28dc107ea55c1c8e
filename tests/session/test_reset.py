"""session.reset(): weights changed outside training (model.load_state_dict inside the `with` block, as
Trainer(resume_from_checkpoint=...) does) are not merged as training; a contribution far outside the node's
own history is refused with an error naming that fix; a large first contribution is not.

One node, outer lr 1, no momentum: each commit is the node's own snapshot, so the committed model is plain
local SGD over exactly the steps the run merged, and a test can name them.
"""

import time

import pytest
import torch

import slowlink as sl
from slowlink.protocol.run import read_commit

from .nodes import batches, sgd_step, tiny_mlp
from .test_checkpoint import Gate

H = 4
BATCHES = batches(0, 24)


def algorithm(**options) -> sl.DiLoCo:
    options = {"overlap_steps": 0} | options
    return sl.DiLoCo(sync_every=H, outer_lr=1.0, outer_momentum=0.0, **options)


def plain_sgd(indices, lr: float) -> torch.nn.Module:
    model = tiny_mlp()
    for index in indices:
        sgd_step(model, BATCHES[index], lr)
    return model


def committed(mailbox) -> torch.nn.Module:
    model = tiny_mlp(seed=99)
    sl.align(model, mailbox=mailbox)
    return model


def distance(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return (
        sum(((x - y) ** 2).sum().item() for x, y in zip(a.parameters(), b.parameters(), strict=True)) ** 0.5
    )


def assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(x, y, atol=1e-5), (x, y)


def train(mailbox, *, lr: float, load_at: int | None = None, reset: bool = False, events=None, **options):
    """Train on BATCHES; before step `load_at` the model loads another model's weights (and resets)."""
    model, other = tiny_mlp(), tiny_mlp(seed=7).state_dict()
    with sl.Session(model, algorithm=algorithm(**options), mailbox=mailbox, node_id="n", poll_seconds=0.005,
                    on_event=None if events is None else events.append) as session:  # fmt: skip
        for index, batch in enumerate(BATCHES):
            if index == load_at:
                model.load_state_dict(other)
                if reset:
                    session.reset()
            sgd_step(model, batch, lr)
            session.step(samples=4)
    return model, session


def test_weights_loaded_inside_the_block_and_reset_are_not_merged_as_training(tmp_path):
    # The case: loaded mid-round (after step 10), and published as one huge pseudo-gradient. At this
    # learning rate its Δ is within ten times a round's, so no norm check can tell it from training.
    loaded = sl.DirMailbox(tmp_path / "loaded")
    train(loaded, lr=0.1, load_at=10)
    events = []
    _, session = train(sl.DirMailbox(tmp_path / "reset"), lr=0.1, load_at=10, reset=True, events=events)
    untouched = sl.DirMailbox(tmp_path / "untouched")
    train(untouched, lr=0.1)
    start = tiny_mlp()
    # Merged as training, the load moved the committed model more than twice as far as the training did.
    assert distance(committed(loaded), start) > 2 * distance(committed(untouched), start)
    # Reset, the model took commit 2 again (steps 1-8), dropped steps 9 and 10, and trained on from there.
    assert_same(committed(sl.DirMailbox(tmp_path / "reset")), plain_sgd([*range(8), *range(10, 24)], 0.1))
    assert session.stats.steps_dropped == 2 and session.stats.contributions_refused == 0
    told = [e for e in events if e.kind == "reset"]
    assert [(e.data["versions"], e.data["steps"]) for e in told] == [([2], 2)]


def test_a_contribution_far_outside_the_nodes_history_is_refused_with_the_fix_and_reset_recovers(tmp_path):
    mailbox, model, events = sl.DirMailbox(tmp_path / "run"), tiny_mlp(), []
    with sl.Session(model, algorithm=algorithm(), mailbox=mailbox, node_id="n", poll_seconds=0.005,
                    on_event=events.append) as session:  # fmt: skip
        for index in range(12):
            if index == 10:  # no reset: the sync after step 12 would publish the load
                model.load_state_dict(tiny_mlp(seed=7).state_dict())
            sgd_step(model, BATCHES[index], 0.01)
            if index < 11:
                session.step(samples=4)
        with pytest.raises(sl.ContributionRefused, match=r"times .*this node's 2 recently merged") as refused:
            session.step(samples=4)
        assert "session.reset()" in str(refused.value) and "load before entering" in str(refused.value)
        assert session.node.state.in_flight() == 0 and session.node.state.pending_steps(0) == 4
        assert read_commit(mailbox, 0, 3) is None  # nothing reached the store
        session.reset()
        for index in range(12, 24):
            sgd_step(model, BATCHES[index], 0.01)
            session.step(samples=4)
    assert_same(committed(mailbox), plain_sgd([*range(8), *range(12, 24)], 0.01))
    stats = session.stats
    assert stats.contributions_refused == 1 and stats.steps_dropped == 4 and stats.versions == (5,)
    assert [e.data["round"] for e in events if e.kind == "contribution_refused"] == [3]


def test_a_large_first_contribution_and_a_rising_learning_rate_are_not_refused(tmp_path):
    # Round 1 at lr 1 (nothing to judge it by), then 0.002 rising threefold a round: the judge needs a
    # history, and honest growth stays within max_norm_ratio of it.
    mailbox, model = sl.DirMailbox(tmp_path / "run"), tiny_mlp()
    rates = [1.0] * H + [0.002] * H + [0.006] * H + [0.018] * H
    with sl.Session(
        model, algorithm=algorithm(), mailbox=mailbox, node_id="n", poll_seconds=0.005
    ) as session:
        for index, lr in enumerate(rates):
            sgd_step(model, BATCHES[index], lr)
            session.step(samples=4)
    assert session.stats.contributions_refused == 0 and session.stats.own_contributions_rejected == 0
    norms = [read_commit(mailbox, 0, r)["contributors"][0]["norm"] for r in range(1, 5)]
    assert norms[0] > 10 * max(norms[1:3])  # the first one was large indeed
    reference = tiny_mlp()
    for index, lr in enumerate(rates):
        sgd_step(reference, BATCHES[index], lr)
    assert_same(committed(mailbox), reference)


def test_a_reset_with_a_contribution_in_flight_keeps_it_and_carries_its_commit(tmp_path):
    # overlap τ = 2: round 1 (steps 1-4) is in flight when the model is reset after step 5; its commit lands
    # at step 6 and is carried onto the parameters the node grew from the reset (θ ← θ + Θ_1 − Θ_0).
    mailbox, model, events = sl.DirMailbox(tmp_path / "run"), tiny_mlp(), []
    with sl.Session(model, algorithm=algorithm(overlap_steps=2), mailbox=mailbox, node_id="n",
                    poll_seconds=0.005, on_event=events.append) as session:  # fmt: skip
        for index in range(8):
            if index == 5:
                model.load_state_dict(tiny_mlp(seed=7).state_dict())
                session.reset()
            sgd_step(model, BATCHES[index], 0.1)
            session.step(samples=4)
    round_1, start = plain_sgd(range(4), 0.1), tiny_mlp()
    after_reset = plain_sgd([5], 0.1)  # step 6, from Θ_0
    with torch.no_grad():
        for theta, commit, initial in zip(after_reset.parameters(), round_1.parameters(), start.parameters(),
                                          strict=True):  # fmt: skip
            theta += commit - initial
    for index in (6, 7):
        sgd_step(after_reset, BATCHES[index], 0.1)
    assert_same(committed(mailbox), after_reset)
    sent = [(e.data["round"], e.data["steps"]) for e in events if e.kind == "contribution_sent"]
    assert sent == [(1, 4), (2, 3)] and session.stats.steps_dropped == 1
    assert [c["node"] for c in read_commit(mailbox, 0, 1)["contributors"]] == ["n"]


def test_a_checkpoint_saved_after_a_reset_resumes_without_the_contribution_made_before_it(tmp_path):
    # As above, round 1 is in flight at the reset after step 5, and the checkpoint is saved there; the round
    # commits while the node is down. Resumed, the node must not take the round's Δ out of its parameters
    # again: they were set to Θ_0 at the reset and hold none of it. So the run is plain SGD over batches
    # 0-3 (round 1), then 5-7 from the resumed step.
    mailbox, path = sl.DirMailbox(tmp_path / "run"), tmp_path / "n.ckpt"
    gate, model = Gate(mailbox), tiny_mlp()
    gate.refused = ("commits/",)  # round 1 goes out at step 4, but cannot commit yet
    options = dict(algorithm=algorithm(overlap_steps=2), node_id="n", poll_seconds=0.005, lease_seconds=0.5)
    first = sl.Session(model, mailbox=gate, **options).__enter__()  # killed below: it never leaves
    for index in range(5):
        sgd_step(model, BATCHES[index], 0.1)
        first.step(samples=4)
    model.load_state_dict(tiny_mlp(seed=7).state_dict())
    first.reset()
    sl.checkpoint.save(path, first)
    gate.refused = ()
    deadline = time.monotonic() + 10
    while read_commit(mailbox, 0, 1) is None:
        assert time.monotonic() < deadline, "round 1 did not commit"
        time.sleep(0.005)
    gate.cut = True  # the node is killed: it never applied round 1
    first.courier.stop()
    resumed = tiny_mlp(seed=5)
    with sl.Session(resumed, mailbox=mailbox, **options) as second:
        assert sl.checkpoint.load(path, second) == 5
        assert_same(resumed, plain_sgd(range(4), 0.1))  # commit 1, nothing taken out of it
        for index in (5, 6, 7):
            sgd_step(resumed, BATCHES[index], 0.1)
            second.step(samples=4)
    assert_same(committed(mailbox), plain_sgd([0, 1, 2, 3, 5, 6, 7], 0.1))
    assert [c["steps"] for c in read_commit(mailbox, 0, 2)["contributors"]] == [3]


def test_a_reset_after_loading_other_frozen_weights_names_the_tensor_and_changes_nothing(tmp_path):
    model = tiny_mlp()
    model[0].weight.requires_grad_(False)  # a frozen base: never sent, checked equal at join
    with sl.Session(model, algorithm=algorithm(), mailbox=sl.DirMailbox(tmp_path / "run"), node_id="n",
                    poll_seconds=0.005) as session:  # fmt: skip
        model.load_state_dict(tiny_mlp(seed=7).state_dict())
        loaded = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(sl.SchemaMismatch, match=r"frozen tensor '0.weight'"):
            session.reset()
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), loaded, strict=True))
