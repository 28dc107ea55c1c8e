"""The simulator runs the real engine and method: in the deterministic configurations (a barrier, every node
in every round) it ends on the parameters a MemoryMailbox run with threads ends on, and a Decoupled run of
one seed is the same run, bit for bit, every time."""

import numpy as np
import pytest

import slowlink as sl
from slowlink import sim

from .common import data_for, max_difference, mse, parameters, run_nodes, sgd, tiny_mlp

STEPS = 24


@pytest.mark.parametrize(
    "algorithm",
    [
        pytest.param(sl.DiLoCo(sync_every=4, quorum_size=3, overlap_steps=0), id="DiLoCo, barrier"),
        pytest.param(
            sl.DiLoCo(sync_every=8, fragments=4, overlap_steps=2, quorum_size=3),
            id="Streaming, 4 fragments, tau 2",
        ),
    ],
)
def test_the_simulator_ends_where_a_memory_mailbox_run_ends(algorithm):
    models, stats = run_nodes(3, algorithm, sl.MemoryMailbox(), STEPS)
    result = sim.run(algorithm, tiny_mlp, data_for(3, STEPS), workers=3, steps=STEPS, loss=mse, optimizer=sgd(),
                     network=sim.Network(bandwidth="100Mbps", latency="30ms"), seed=0)  # fmt: skip
    commits = sum(s.commits_applied for s in stats)
    assert commits == sum(r.events["commit_applied"] for r in result.workers) > 0
    for simulated, real in zip(result.models, models, strict=True):
        assert max_difference(simulated, real) < 1e-6
    # Not trivially equal: training moved the parameters, and every round merged all three nodes.
    assert max_difference(result.models[0], tiny_mlp()) > 1e-2
    assert all(len(commit.contributors) == 3 for commit in result.commits)


def decoupled_run(seed: int):
    algorithm = sl.DiLoCo(sync_every=4, fragments=2, quorum_size=1, grace_seconds=0.0)
    return sim.run(algorithm, tiny_mlp, data_for(3, STEPS), workers=3, steps=STEPS, loss=mse, optimizer=sgd(),
                   step_seconds=[1.0, 1.0, 2.0], jitter=0.1, seed=seed,
                   network=sim.Network(bandwidth="10Mbps", latency="50ms"))  # fmt: skip


def test_a_decoupled_run_of_one_seed_is_bit_identical_and_another_seed_differs():
    first, again, other = decoupled_run(0), decoupled_run(0), decoupled_run(1)
    for a, b in zip(first.models, again.models, strict=True):
        for name, values in parameters(a).items():
            assert np.array_equal(values, parameters(b)[name])
    assert first.commits == again.commits
    assert [r.losses for r in first.workers] == [r.losses for r in again.workers]
    assert first.commits != other.commits  # the jitter, drawn from the seed, moved the schedule


def test_a_decoupled_run_follows_the_schedule_derived_by_hand():
    """H = 2, one fragment, quorum 1, grace 0.25 s; workers of 1, 1 and 2 s a step, links of 0.1, 0.2 and 0.5 s
    each way, no bandwidth limit, 6 steps each (batches of 4 samples). By hand:
        t=2     w0, w1 send round 1 (2 steps each); they land at 2.1 and 2.2. Quorum at 2.1: closes at 2.35.
        t=4     w0, w1 send round 2 (land 4.1, 4.2); w2, at its step 2, holds round 1 (2.35 + 0.5 ≤ 4) and sends
                round 2 too, landing at 4.5: after round 2 closed at 4.35, so it is late (told at 4.85).
        t=6     w2 carries its 2 steps and, re-anchored at round 2, sends them with its third step to round 3 at
                once (landing 6.5); w0, w1 send round 3 (closes 6.35: w2 is late again, told at 6.85) and leave
                once it is in (6.45, 6.55).
        t=8     w2, alone, sends round 4 with 4 steps (3 carried); every live node in: closes at 8.5.
        t=12    w2 sends round 5 (2 steps), closing at 12.5, and leaves when it arrives (13.0)."""
    algorithm = sl.DiLoCo(sync_every=2, quorum_size=1, grace_seconds=0.25)
    network = sim.Network(latency=[0.1, 0.2, 0.5])
    result = sim.run(algorithm, tiny_mlp, data_for(3, 6), workers=3, steps=6, loss=mse, optimizer=sgd(),
                     step_seconds=[1.0, 1.0, 2.0], network=network, seed=0)  # fmt: skip
    schedule = [(c.fragment, c.round, round(c.time, 6), c.contributors) for c in result.commits]
    assert schedule == [
        (0, 1, 2.35, ((0, 2, 8), (1, 2, 8))),
        (0, 2, 4.35, ((0, 2, 8), (1, 2, 8))),
        (0, 3, 6.35, ((0, 2, 8), (1, 2, 8))),
        (0, 4, 8.5, ((2, 4, 16),)),
        (0, 5, 12.5, ((2, 2, 8),)),
    ]
    w0, w1, w2 = result.workers
    assert [w.events["contribution_late"] for w in result.workers] == [0, 0, 2]
    assert [w.steps_carried for w in result.workers] == [0, 0, 5]
    assert [w.events["commit_applied"] for w in result.workers] == [3, 3, 5]
    assert [round(w.wall_seconds, 6) for w in result.workers] == [6.45, 6.55, 13.0]
    assert [(round(start, 6), round(seconds, 6), why) for start, seconds, why in w0.stalls] == [
        (6.0, 0.45, "leaving")
    ]
    assert w2.compute_seconds == 12.0 and round(w2.stalled_seconds, 6) == 1.0  # leaving: 12 → 13
