"""commit_dtype and error_feedback in real sessions: nodes rebuild each commit from its small change and
check it against the commit's digest (falling back to the full parameters), and error feedback delivers
what a 4-bit encoding alone would lose for good."""

import time

import numpy as np
import pytest
import torch

import slowlink as sl
from slowlink.mailbox.contract import Object
from slowlink.protocol.run import read_commit
from slowlink.wire import payload

from .nodes import run_nodes, wide_mlp


def flat(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


def committed_model(mailbox) -> np.ndarray:
    model = wide_mlp(seed=1)  # other values than the run's start: align must overwrite every one
    sl.align(model, mailbox=mailbox)
    return flat(model)


@pytest.mark.parametrize("commit_dtype", ["BF16", "F8_E4M3_TENSOR", "F4"])
def test_nodes_rebuild_every_commit_from_its_change_bit_for_bit_and_download_fewer_bytes(commit_dtype):
    runs = {}
    for dtype in (None, commit_dtype):
        mailbox, events = sl.MemoryMailbox(), []
        algorithm = sl.DiLoCo(sync_every=4, quorum_size=2, overlap_steps=0, commit_dtype=dtype)
        models, stats = run_nodes(
            2, algorithm, mailbox, 24, lr=0.02, make_model=wide_mlp, on_event=events.append
        )
        runs[dtype] = (mailbox, events, models, stats)
    mailbox, events, models, stats = runs[commit_dtype]
    assert not [e for e in events if e.kind == "commit_change_refused"]
    assert all(s.commits_applied == 6 for s in stats)
    final = committed_model(mailbox)
    for model in models:  # every node, the merger and the one that rebuilt commits from changes alike
        np.testing.assert_array_equal(flat(model), final)
    record = read_commit(mailbox, 0, 6)
    assert (
        record["change"] is not None and runs[None][0] and read_commit(runs[None][0], 0, 6)["change"] is None
    )
    # The node that did not merge downloaded changes instead of parameters (both runs join alike, from a
    # full copy of the initial model, which keeps the ratio under the encoding's own).
    learner = next(s for s in stats if s.rounds_merged == 0)
    baseline = next(s for s in runs[None][3] if s.rounds_merged == 0)
    assert (
        baseline.bytes_received
        > {"BF16": 1.6, "F8_E4M3_TENSOR": 2.2, "F4": 3.0}[commit_dtype] * learner.bytes_received
    ), (
        baseline.bytes_received,
        learner.bytes_received,
    )


class TamperedChanges(sl.MemoryMailbox):
    """A store that hands back every commit change blob altered: a reader must catch it and recover."""

    def get(
        self, key: str, *, if_none_match: str | None = None, max_bytes: int | None = None
    ) -> Object | None:
        found = super().get(key, if_none_match=if_none_match, max_bytes=max_bytes)
        is_blob = found is not None and found.data is not None and key.startswith("blobs/")
        if is_blob and payload.read_header(found.data)["kind"] == "change":
            return Object(found.data[:-4] + b"\0\0\0\0", found.etag)
        return found


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.mark.parametrize("fault", ["held parameters differ", "change blob altered"])
def test_a_change_that_does_not_rebuild_the_commit_is_refused_for_the_full_parameters(fault):
    mailbox = TamperedChanges() if fault == "change blob altered" else sl.MemoryMailbox()
    algorithm = sl.DiLoCo(
        sync_every=2, commit_dtype="BF16", outer_lr=1.0, outer_momentum=0.0, snapshot_every=1
    )  # every commit a snapshot: the full parameters to fall back on
    events: list[sl.Event] = []
    leader_model, other_model = wide_mlp(), wide_mlp()
    with sl.Session(
        leader_model, algorithm=algorithm, mailbox=mailbox, node_id="leader", poll_seconds=0.005
    ) as leader:
        wait_until(lambda: leader.stats.is_leader, "the first node to lead")
        with sl.Session(other_model, algorithm=algorithm, mailbox=mailbox, node_id="other", poll_seconds=0.005,
                        on_event=events.append) as other:  # fmt: skip
            if fault == "held parameters differ":  # as if this node's copy of version 0 had gone bad
                version, held = other.courier.latest[0]
                other.courier.latest[0] = (version, {name: values + 1e-3 for name, values in held.items()})
            with torch.no_grad():
                for _ in range(2):  # one round of the leader alone
                    for p in leader_model.parameters():
                        p -= 0.01
                    leader.step()
            wait_until(lambda: other.courier.latest[0][0] == 1, "the other node to fetch round 1")
    refused = [e for e in events if e.kind == "commit_change_refused"]
    assert len(refused) == 1 and refused[0].data["round"] == 1
    assert ("differ" if fault == "held parameters differ" else "digest") in refused[0].data["reason"]
    final = committed_model(mailbox)
    np.testing.assert_array_equal(flat(other_model), final)  # the full parameters, not held + change
    np.testing.assert_array_equal(flat(leader_model), final)


def one_block_run(error_feedback: bool, rounds: int, drift: np.ndarray) -> np.ndarray:
    """One node, one 32-value tensor (one F4 block), a fixed drift per step, synchronous rounds: the
    committed tensor after `rounds` rounds."""
    model = torch.nn.Linear(32, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    algorithm = sl.DiLoCo(sync_every=4, overlap_steps=0, outer_lr=1.0, outer_momentum=0.0, delta_dtype="F4",
                          error_feedback=error_feedback)  # fmt: skip
    mailbox = sl.MemoryMailbox()
    with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="n", poll_seconds=0.002) as session:
        for _ in range(rounds * 4):
            with torch.no_grad():
                model.weight -= torch.from_numpy(drift)
            session.step()
    assert session.stats.commits_applied == rounds
    return model.weight.detach().numpy().ravel().copy()


def test_error_feedback_delivers_the_small_drift_that_4_bit_deltas_alone_lose_for_good():
    # One value drifts by 1 a step, the rest by 0.01: a round's Δ of 0.04 is under half F4's smallest
    # step at this block's scale, so without feedback it rounds to zero every round.
    drift = np.full(32, 0.01, np.float32)
    drift[0] = 1.0
    rounds = 25
    truth = -rounds * 4 * drift
    without = one_block_run(False, rounds, drift)
    with_feedback = one_block_run(True, rounds, drift)
    assert without[0] == truth[0] and with_feedback[0] == truth[0]
    np.testing.assert_array_equal(without[1:], 0.0)  # lost for good
    # With feedback a node's sum sent equals its sum trained less its residual, at most half a step of 0.5.
    assert np.abs(with_feedback[1:] - truth[1:]).max() <= 0.25 + 1e-6, with_feedback[1:]
