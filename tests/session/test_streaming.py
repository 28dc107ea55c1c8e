"""Streaming DiLoCo: staggered fragments, overlap τ and mixing α (research/algorithms.md §2.2–§2.3)."""

import threading

import numpy as np
import pytest
import torch

import slowlink as sl
import slowlink.protocol.run
from slowlink.frameworks.torch import TorchAdapter


class Blocks(torch.nn.Module):
    """An embedding and three equal blocks: Strided makes fragment 0 the embedding, 1..3 the blocks."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Linear(6, 6, bias=False)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(6, 6, bias=False) for _ in range(3))

    def forward(self, x):
        x = self.emb(x)
        for block in self.blocks:
            x = torch.tanh(block(x))
        return x


def test_each_fragment_syncs_on_its_own_phase_once_per_h_steps_with_about_a_pth_of_the_bytes():
    model, events = Blocks(), []
    algorithm = sl.DiLoCo(sync_every=8, fragments=4, partition=sl.Strided(), overlap_steps=0)
    with sl.Session(model, algorithm=algorithm, mailbox=sl.MemoryMailbox(), node_id="solo",
                    on_event=events.append, poll_seconds=0.005) as session:  # fmt: skip
        constant_descent_blocks(model, session, 40)
    sent = [e.data for e in events if e.kind == "contribution_sent"]
    # s = ⌊8/4⌋ = 2: fragment q syncs at steps 2q + 8k, k ≥ 1.
    for q in range(4):
        assert [d["step"] for d in sent if d["fragment"] == q] == [
            2 * q + 8 * k for k in range(1, 6) if 2 * q + 8 * k <= 40
        ]
    model_bytes = sum(p.numel() * 4 for p in model.parameters())
    for d in sent:
        assert 0.25 * model_bytes <= d["bytes"] <= 0.25 * model_bytes + 2048  # one fragment plus a header


def one_weight_model() -> torch.nn.Module:
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    return model


def constant_descent(model, session, steps):
    """Each step moves w by exactly −1 (loss = w, SGD lr 1): the local trajectory is known in advance."""
    trace = []
    for _ in range(steps):
        model.zero_grad()
        model(torch.ones(1, 1)).sum().backward()
        with torch.no_grad():
            model.weight -= model.weight.grad
        session.step(samples=1)
        trace.append(model.weight.item())
    return trace


@pytest.mark.parametrize(
    ("mixing", "expected_trace"),
    [
        # α = 0.5, τ = 1, H = 2, η = 1, μ = 0; w0 = 0, one node.
        # step 2: w = −2, send Δ = 0 − (−2) = 2.   step 3: w = −3; commit Θ1 = 0 − 2 = −2;
        #         blend 0.5·(−3) + 0.5·(−2) = −2.5.  step 4: w = −3.5, send Δ = −2 − (−3.5) = 1.5.
        # step 5: w = −4.5; commit Θ2 = −2 − 1.5 = −3.5; blend 0.5·(−4.5) + 0.5·(−3.5) = −4.
        (0.5, [-1.0, -2.0, -2.5, -3.5, -4.0]),
        # α = 0: step 3 replaces −3 by Θ1 = −2; step 4: −3, Δ = 1; step 5: −4 replaced by Θ2 = −3.
        (0.0, [-1.0, -2.0, -2.0, -3.0, -3.0]),
    ],
)
def test_overlap_and_mixing_follow_the_streaming_equations_on_a_hand_computed_case(mixing, expected_trace):
    model, events = one_weight_model(), []
    algorithm = sl.DiLoCo(sync_every=2, overlap_steps=1, mixing=mixing, outer_lr=1.0, outer_momentum=0.0)
    with sl.Session(model, algorithm=algorithm, mailbox=sl.MemoryMailbox(), node_id="solo",
                    on_event=events.append, poll_seconds=0.005) as session:  # fmt: skip
        trace = constant_descent(model, session, 5)
        assert session.stats.versions == (2,)
        assert session.stats.steps_replaced == 2  # one overlap step at each of the two commits
    assert trace == pytest.approx(expected_trace)


def test_a_commit_without_this_nodes_contribution_carries_its_steps_into_the_next_one():
    # "fast" leads and closes round 1 alone (quorum 1, grace 0). "slow" polls only when woken, so it
    # snapshots for round 1 before it has seen that commit: its contribution arrives late.
    mailbox, events = sl.MemoryMailbox(), []
    algorithm = sl.DiLoCo(
        sync_every=2, outer_lr=1.0, outer_momentum=0.0, grace_seconds=0.0, adaptive_outer=False
    )
    fast, slow = one_weight_model(), one_weight_model()
    with sl.Session(fast, algorithm=algorithm, mailbox=mailbox, node_id="fast", poll_seconds=0.005) as a:
        _wait_until(lambda: a.courier.leadership.is_leader)
        with sl.Session(slow, algorithm=algorithm, mailbox=mailbox, node_id="slow", poll_seconds=1000,
                        on_event=events.append) as b:  # fmt: skip
            constant_descent(fast, a, 2)  # fast sends Δ = 2 for round 1
            _wait_until(lambda: a.courier.latest[0][0] == 1)  # round 1 committed from fast alone: Θ1 = −2
            constant_descent(slow, b, 2)  # slow: w = −2 and sends Δ = 2 for round 1, already closed
            _wait_until(lambda: not b.courier.inbox.empty())
            constant_descent(slow, b, 1)
            # slow held Θ0 = 0 and trained to −3: carry gives −3 + (Θ1 − Θ0) = −5: all 3 steps kept.
            assert slow.weight.item() == pytest.approx(-5.0)
            # Whether the missed steps went out again at once depends on whether the commit told slow that
            # it missed (its courier uploaded before it polled) or the refusal came after: both keep all 3.
            assert b.stats.contributions_late == 1 and b.stats.contributions_sent in (1, 2)
    late = [e for e in events if e.kind == "contribution_late"]
    assert late[0].data == {"fragment": 0, "round": 1, "steps": 2}
    record = sl.protocol.run.read_commit(mailbox, 0, 1)
    assert [c["node"] for c in record["contributors"]] == ["fast"]


def _wait_until(condition, timeout=10.0):
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("condition not met in time")


def test_torch_adapter_blend_and_shift_edit_parameters_in_place():
    model = one_weight_model()
    adapter = TorchAdapter(model)
    weight = model.weight
    adapter.shift({"weight": np.array([[2.0]], np.float32)})
    adapter.blend({"weight": np.array([[0.0]], np.float32)}, 0.25)
    assert model.weight is weight and model.weight.item() == pytest.approx(0.5)


def test_a_joiner_takes_the_runs_phase_so_its_fragments_fall_due_with_everyone_elses():
    # H = 4, two fragments (offsets 0 and 2). "first" trains 5 steps: fragment 0 commits at step 4.
    # A joiner at versions (1, 0) takes phase 4: its next due fragment is 1, at run step 6 = its step 2.
    mailbox, events = sl.MemoryMailbox(), []
    algorithm = sl.DiLoCo(sync_every=4, fragments=2, partition=sl.Strided(), overlap_steps=0)
    first = Blocks()
    with sl.Session(first, algorithm=algorithm, mailbox=mailbox, node_id="first", poll_seconds=0.005) as a:
        constant_descent_blocks(first, a, 5)
    joiner = Blocks()
    with sl.Session(joiner, algorithm=algorithm, mailbox=mailbox, node_id="joiner", poll_seconds=0.005,
                    on_event=events.append) as b:  # fmt: skip
        assert b.stats.versions == (1, 0)
        constant_descent_blocks(joiner, b, 6)
    sent = [(e.data["fragment"], e.data["step"]) for e in events if e.kind == "contribution_sent"]
    assert sent == [(1, 2), (0, 4), (1, 6)]


def constant_descent_blocks(model, session, steps):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(3)
    for _ in range(steps):
        x = torch.randn(2, 6, generator=generator)
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        session.step(samples=2)


def test_with_a_barrier_a_sync_whose_round_is_already_committed_is_skipped_and_its_steps_kept():
    # H = 4, offsets 0 and 2, τ = 0. "first" commits fragment 0 round 1 at step 4, then "joiner" joins at
    # (1, 0) with phase 4, and "first" commits fragment 1 round 1 at step 6 alone. The joiner's fragment 1
    # falls due at run step 6, for round 1, already committed: it skips it and syncs fragment 0 round 2.
    mailbox, events = sl.MemoryMailbox(), []
    algorithm = sl.DiLoCo(
        sync_every=4, fragments=2, partition=sl.Strided(), overlap_steps=0, grace_seconds=0.0
    )
    first, joiner = Blocks(), Blocks()
    with sl.Session(first, algorithm=algorithm, mailbox=mailbox, node_id="first", poll_seconds=0.005) as a:
        constant_descent_blocks(first, a, 4)
        with sl.Session(joiner, algorithm=algorithm, mailbox=mailbox, node_id="joiner", poll_seconds=0.005,
                        on_event=events.append) as b:  # fmt: skip
            assert b.stats.versions == (1, 0)
            constant_descent_blocks(first, a, 2)  # fragment 1 round 1, from "first" alone
            _wait_until(lambda: b.courier.latest[1][0] == 1)
            constant_descent_blocks(joiner, b, 4)
            assert b.stats.syncs_skipped == 1
    skipped = [e.data for e in events if e.kind == "sync_skipped"]
    assert skipped == [{"fragment": 1, "round": 1}]
    sent = [(e.data["fragment"], e.data["round"]) for e in events if e.kind == "contribution_sent"]
    assert sent[0] == (0, 2)
