"""Virtual time is right: the simulator's wall time and utilization for DiLoCo over an all-reduce are the
closed forms of research/algorithms.md §2.5 (blocking: CU = H·T / (H·T + T_AR), with the ring all-reduce
T_AR(S) = 2(M−1)·λ + 2(M−1)/M · 8S/W of §0), and with overlap τ ≥ 1 on a fast enough link nothing stalls."""

import pytest
import torch

import slowlink as sl
from slowlink import sim

from .common import data_for, mse, sgd

WORKERS, H, STEP_SECONDS, LATENCY = 3, 10, 1.0, 0.03


def wide_model():
    """67k float32 parameters: 268 kB, so the payload's header is under 0.3% of what a round moves."""
    return torch.nn.Sequential(torch.nn.Linear(3, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256), torch.nn.Tanh(),
                               torch.nn.Linear(256, 1))  # fmt: skip


def model_bytes() -> int:
    return sum(p.numel() * 4 for p in wide_model().parameters())


def t_allreduce(nbytes: int, bandwidth: float) -> float:
    m = WORKERS
    return 2 * (m - 1) * LATENCY + 2 * (m - 1) / m * 8 * nbytes / bandwidth


def simulate(algorithm, bandwidth: float, steps: int):
    network = sim.Network(bandwidth=bandwidth, latency=LATENCY, exchange="allreduce")
    return sim.run(algorithm, wide_model, data_for(WORKERS, steps), workers=WORKERS, steps=steps, loss=mse,
                   optimizer=sgd(0.01), step_seconds=STEP_SECONDS, network=network, seed=0)  # fmt: skip


@pytest.mark.parametrize("bandwidth", [1e6, 1e7])  # T_AR ≈ 2.97 s and 0.41 s against H·T = 10 s
def test_blocking_diloco_matches_the_closed_form_within_one_percent(bandwidth):
    rounds = 4
    result = simulate(sl.DiLoCo(sync_every=H, quorum_size=WORKERS, overlap_steps=0), bandwidth, rounds * H)
    exposed = t_allreduce(model_bytes(), bandwidth)
    utilization = H * STEP_SECONDS / (H * STEP_SECONDS + exposed)
    for report in result.workers:
        assert report.utilization == pytest.approx(utilization, rel=0.01)
        assert report.wall_seconds == pytest.approx(rounds * (H * STEP_SECONDS + exposed), rel=0.01)
        assert [why for _, _, why in report.stalls] == ["barrier"] * rounds
    assert len(result.commits) == rounds
    assert utilization < 0.98  # the case is one where the exchange shows


def test_with_overlap_and_enough_bandwidth_nothing_stalls():
    bandwidth = 1e8  # T_AR ≈ 0.09 s, well inside one step of overlap
    assert t_allreduce(model_bytes(), bandwidth) < STEP_SECONDS
    # 45 steps: the last sync is at step 40, so leaving has no round to wait for.
    result = simulate(sl.DiLoCo(sync_every=H, quorum_size=WORKERS, overlap_steps=1), bandwidth, 45)
    assert len(result.commits) == 4
    for report in result.workers:
        assert report.stalled_seconds == 0 and report.utilization == 1.0
        assert report.wall_seconds == pytest.approx(45 * STEP_SECONDS)


def test_a_slow_link_stalls_the_overlap_by_what_it_cannot_hide():
    bandwidth = 1e6  # T_AR ≈ 2.97 s against τ·T = 1 s: each round exposes T_AR − τ·T
    result = simulate(sl.DiLoCo(sync_every=H, quorum_size=WORKERS, overlap_steps=1), bandwidth, 45)
    exposed = t_allreduce(model_bytes(), bandwidth) - STEP_SECONDS
    for report in result.workers:
        assert report.stalled_seconds == pytest.approx(4 * exposed, rel=0.01)
