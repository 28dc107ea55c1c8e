"""Gossip methods in the simulator (sim/gossip.py): the consensus distance orders the variants as the factor
F = 1 + ρ2/(1−ρ1) predicts (research/algorithms.md §4.3), and virtual time charges only the blocking mix."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from slowlink.algorithms.gossip import GossipDiLoCo
from slowlink.algorithms.noloco import NoLoCo
from slowlink.sim import Network
from slowlink.sim.gossip import run_gossip

# The noisy quadratic of benchmarks/gossip_definitions.py, whose figures docs/BENCHMARKS.md keeps: one problem.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gossip_definitions import OPTIMUM, Quadratic, noisy  # noqa: E402


def simulate(method, steps: int = 80, network: Network | None = None):
    return run_gossip(method, Quadratic, noisy, workers=8, steps=steps, network=network, samples=lambda batch: 1,
                      optimizer=lambda params: torch.optim.SGD(params, lr=0.05))  # fmt: skip


def test_consensus_distance_orders_the_variants_as_the_factor_predicts():
    measured = {}
    for variant in ("DiLoCo", "GlobalM1LocalM2", "LocalM1M2", "GlobalM1"):
        result = simulate(GossipDiLoCo(sync_every=5, variant=variant), steps=50)
        measured[variant] = float(np.mean([value for round_, value in result.consensus if round_ >= 3]))
        assert all(sum(w.self_mixed.values()) == 0 for w in result.workers)  # every message came in time
        mean = np.stack([m.w.detach().numpy() for m in result.models]).mean(0)
        assert np.linalg.norm(mean - OPTIMUM.numpy()) < 0.3 * np.linalg.norm(OPTIMUM.numpy())  # it trained
    # Measured (relative L2 of the round starts, rounds 3-10): DiLoCo 0 (F=1), GlobalM1LocalM2 0.0181
    # (F=1.43), GlobalM1 0.0329 (F=2), LocalM1M2 0.0400 (F=1.75): the order F predicts, with LocalM1M2 and
    # GlobalM1 both above GlobalM1LocalM2 (the bound does not order those two finely).
    assert measured["DiLoCo"] == 0.0
    assert measured["GlobalM1LocalM2"] == pytest.approx(0.0181, rel=0.02)
    assert measured["GlobalM1"] == pytest.approx(0.0329, rel=0.02)
    assert measured["LocalM1M2"] == pytest.approx(0.0400, rel=0.02)
    assert 0 < measured["GlobalM1LocalM2"] < min(measured["GlobalM1"], measured["LocalM1M2"])


def test_virtual_time_charges_the_blocking_mix_and_overlaps_mix1():
    # 64 bytes of float32: a ring all-reduce among 8 takes 2·7/8·8·64/W = 2 s at W = 448 bit/s, a pair 8·64/W.
    network, rounds = Network(bandwidth=448.0, exchange="pairwise"), 4
    allreduce, pair = 2 * 7 / 8 * 8 * 64 / 448.0, 8 * 64 / 448.0
    diloco = simulate(GossipDiLoCo(sync_every=5, variant="DiLoCo"), steps=20, network=network)
    global_m1 = simulate(GossipDiLoCo(sync_every=5, variant="GlobalM1"), steps=20, network=network)
    local_m2 = simulate(GossipDiLoCo(sync_every=5, variant="GlobalM1LocalM2"), steps=20, network=network)
    noloco = simulate(NoLoCo(sync_every=5), steps=20, network=network)
    assert diloco.wall_seconds == pytest.approx(20 + rounds * allreduce)
    assert global_m1.wall_seconds == pytest.approx(20.0)  # Mix1 lands within the round: no wait
    assert local_m2.wall_seconds == pytest.approx(20 + rounds * pair)
    assert noloco.wall_seconds == pytest.approx(20 + rounds * pair)
    for worker in global_m1.workers:
        assert worker.stall_seconds.get("start", 0.0) == 0.0 and sum(worker.self_mixed.values()) == 0
        assert worker.bytes_sent == {"non_blocking": (rounds + 1) * 112}  # the next round's start too
    assert local_m2.workers[0].bytes_sent == {"non_blocking": (rounds + 1) * 112, "blocking": rounds * 64}
    assert diloco.workers[0].bytes_sent == {"blocking": rounds * 112}
    assert diloco.workers[0].stall_seconds["delta"] == pytest.approx(rounds * allreduce)


def test_a_mix1_too_slow_for_its_round_is_left_out_and_counted():
    # At 100 bit/s the all-gather of starts takes 8.96 s, longer than a round of 5 steps: with mix1_seconds=0
    # each node mixes with itself rather than wait, and says why.
    result = simulate(
        GossipDiLoCo(sync_every=5, variant="GlobalM1"), steps=10, network=Network(bandwidth=100.0)
    )
    assert result.wall_seconds == pytest.approx(10.0)
    assert all(worker.self_mixed == {"late": 2 * 7} for worker in result.workers)


def test_the_diloco_variant_in_the_gossip_simulator_ends_where_sl_diloco_does():
    import slowlink as sl
    from slowlink import sim

    options = {
        "workers": 8,
        "steps": 15,
        "samples": lambda batch: 1,
        "optimizer": lambda p: torch.optim.SGD(p, lr=0.05),
    }
    gossip = run_gossip(GossipDiLoCo(sync_every=5, variant="DiLoCo"), Quadratic, noisy, **options)
    diloco = sim.run(sl.DiLoCo(sync_every=5, overlap_steps=0, quorum_size=8), Quadratic, noisy,
                     loss=lambda model, batch: model(*batch), **options)  # fmt: skip
    for ours, theirs in zip(gossip.models, diloco.models, strict=True):
        # The same rounds to float32 rounding: DiLoCo's node lands on its commit by θ + (Θ − θ_snapshot).
        np.testing.assert_allclose(ours.w.detach().numpy(), theirs.w.detach().numpy(), atol=1e-6)


def test_a_slow_worker_holds_back_a_blocking_mix_but_not_a_non_blocking_one():
    options = {"workers": 8, "steps": 10, "step_seconds": [1.0] * 7 + [2.0], "samples": lambda batch: 1,
               "optimizer": lambda p: torch.optim.SGD(p, lr=0.05)}  # fmt: skip
    diloco = run_gossip(GossipDiLoCo(sync_every=5, variant="DiLoCo"), Quadratic, noisy, **options)
    assert [w.wall_seconds for w in diloco.workers] == [20.0] * 8  # every round waits for the slow one
    global_m1 = run_gossip(GossipDiLoCo(sync_every=5, variant="GlobalM1"), Quadratic, noisy, **options)
    assert [w.wall_seconds for w in global_m1.workers] == [10.0] * 7 + [20.0]  # nobody waits
    # Round 0's starts are the same for all; in round 1 the fast ones mix without the slow one's start (not
    # published yet: late), and the slow one with everyone's, which waited in the store.
    assert [w.self_mixed for w in global_m1.workers] == [{"late": 1}] * 7 + [{}]


def test_mix2_queues_on_the_link_behind_a_mix1_still_on_its_way():
    # At 128 bit/s the all-gather of starts takes 7 s, longer than a round of 5 steps, and a pair's Δ 4 s: Mix2,
    # due at the round's end, goes out once Mix1 is through. A round is 5 + 2 + 4 s (Mix1 waited for).
    method = GossipDiLoCo(sync_every=5, variant="GlobalM1LocalM2", mix1_seconds=100.0)
    result = simulate(method, steps=10, network=Network(bandwidth=128.0, exchange="pairwise"))
    assert result.wall_seconds == pytest.approx(2 * (5 + 2 + 4))
    assert all(worker.stall_seconds["delta"] == pytest.approx(2 * 6) for worker in result.workers)
