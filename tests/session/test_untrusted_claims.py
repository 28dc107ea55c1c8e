"""The merge does not take a peer's word about itself: its samples and steps are bounded, its tensors must
have the schema's shapes, its norm is judged even when it is a round's only contribution, and a merge
that overflows is retried without the offender."""

import time

import numpy as np
import pytest
import torch

import slowlink as sl
from slowlink.protocol.run import read_commit, read_run

from .nodes import batches, sgd_step, tiny_mlp
from .test_bad_peers import plant, zeros
from .test_nothing_lost import shapes


def one_honest_round(bad, *, honest: int = 1, **options) -> tuple[dict, list[torch.nn.Module]]:
    """`honest` nodes train one round (H=2, plain averaging) while `bad(mailbox, run)` plants a
    contribution; the round waits for all of them. Returns round 1's commit record and the models."""
    mailbox = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=2, grace_seconds=30.0, outer_lr=1.0, outer_momentum=0.0, **options)
    models = [tiny_mlp() for _ in range(honest)]
    sessions = [sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id=f"good-{i}",
                           poll_seconds=0.005) for i, model in enumerate(models)]  # fmt: skip
    for session in sessions:
        session.__enter__()
    try:
        bad(mailbox, read_run(mailbox))
        for step in range(2):
            for i, (model, session) in enumerate(zip(models, sessions, strict=True)):
                sgd_step(model, batches(i, 2)[step], 0.1)
                session.step(samples=4)
        deadline = time.monotonic() + 30
        while read_commit(mailbox, 0, 1) is None and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        for session in reversed(sessions):
            session.__exit__(None, None, None)
    record = read_commit(mailbox, 0, 1)
    assert record is not None, "round 1 never committed"
    return record, models


def merged_delta(record: dict, run_schema_model: torch.nn.Module) -> np.ndarray:
    """Δ of the commit: initial − committed parameters (plain averaging, outer lr 1)."""
    initial = torch.cat([p.detach().reshape(-1) for p in tiny_mlp().parameters()])
    committed = torch.cat([p.detach().reshape(-1) for p in run_schema_model.parameters()])
    return (initial - committed).numpy()


@pytest.mark.parametrize("merge", [sl.WeightedMean(), sl.NormClippedMean()])
def test_a_node_claiming_a_trillion_samples_does_not_buy_the_round(merge):
    evil = {}

    def bad(mailbox, run):
        # A Δ as large as an honest one (so under every norm limit), claiming 10¹² samples.
        arrays = {name: np.full(shape, 0.05, np.float32) for name, shape in shapes(run).items()}
        evil.update(arrays)
        plant(mailbox, "evil", arrays, norm=0.0, samples=10**12)

    record, models = one_honest_round(bad, merge=merge)
    contributors = {c["node"]: c for c in record["contributors"]}
    assert set(contributors) == {"good-0", "evil"}
    assert contributors["evil"]["samples"] == 10**12
    # Bounded at MAX_CLAIM_RATIO (4) times the honest node's samples per step: its share is 4/5, not ~1.
    share = contributors["evil"]["weight"] / sum(c["weight"] for c in contributors.values())
    assert share == pytest.approx(0.8)
    delta = merged_delta(record, models[0])
    evil_delta = np.concatenate([evil[name].reshape(-1) for name in evil])
    assert np.abs(delta - evil_delta).max() > 1e-3  # the commit is not the evil contribution


def test_samples_beyond_any_count_are_rejected_and_the_model_stays_finite():
    def bad(mailbox, run):
        plant(mailbox, "evil", zeros(run, 0.01), samples=int("1" * 40))

    record, models = one_honest_round(bad)
    assert [c["node"] for c in record["contributors"]] == ["good-0"]
    assert "beyond" in record["rejected"][0]["reason"]
    assert all(torch.isfinite(p).all() for p in models[0].parameters())


def test_a_tensor_of_the_wrong_shape_is_rejected_naming_the_shape_not_broadcast():
    def bad(mailbox, run):
        arrays = zeros(run, 0.01)
        first = sorted(arrays)[0]
        arrays[first] = np.zeros((1,), np.float32)  # broadcastable into any tensor
        plant(mailbox, "evil", arrays)

    record, _ = one_honest_round(bad)
    assert [c["node"] for c in record["contributors"]] == ["good-0"]
    reason = record["rejected"][0]["reason"]
    assert "shape (1,)" in reason and "expected" in reason


def test_a_huge_contribution_alone_in_its_round_is_rejected_and_the_honest_node_goes_on():
    mailbox = sl.MemoryMailbox()
    model = tiny_mlp()
    events = []
    algorithm = sl.DiLoCo(sync_every=2, outer_lr=1.0, outer_momentum=0.0)  # quorum 1: one contribution merges
    with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="good", poll_seconds=0.005,
                    on_event=events.append) as session:  # fmt: skip
        run = read_run(mailbox)
        plant(mailbox, "evil", zeros(run, 1e30))  # in the run's very first round: no history yet
        deadline = time.monotonic() + 10
        while not any(e.kind == "contribution_rejected" for e in events) and time.monotonic() < deadline:
            time.sleep(0.005)
        deadline = time.monotonic() + 30  # the honest node trains on and its rounds commit, however loaded
        for batch in batches(0, 2000):  # the machine is: a step here is far quicker than a round
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
            if session.stats.versions[0] >= 5 or time.monotonic() > deadline:
                break
            time.sleep(0.002)
    rejected = [e for e in events if e.kind == "contribution_rejected"]
    assert rejected and rejected[0].data["from"] == "evil"
    assert "times the fragment's own norm" in rejected[0].data["reason"]
    assert session.stats.versions[0] >= 5
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_round_that_overflows_is_retried_without_the_largest_contribution():
    def bad(mailbox, run):
        plant(mailbox, "evil-0", zeros(run, 3e38))
        plant(mailbox, "evil-1", zeros(run, 3e38))  # each finite; their weighted sum overflows float32

    record, models = one_honest_round(bad, max_norm_ratio=None)
    reasons = {r["node"]: r["reason"] for r in record["rejected"]}
    assert any("non-finite" in reason for reason in reasons.values())
    assert all(torch.isfinite(p).all() for p in models[0].parameters())
    assert "good-0" in {c["node"] for c in record["contributors"]}
