"""Factored Gossip DiLoCo and NoLoCo pinned to their definitions (research/algorithms.md §4, §5, §8 tests 6-8):
global mixes equal DiLoCo, pairs contract by ρ, no mixing leaves nodes alone, NoLoCo over all is heavy-ball."""

import numpy as np
import pytest

import slowlink as sl
from slowlink.algorithms.gossip import DELTA, START, GossipDiLoCo, pseudo_gradient
from slowlink.algorithms.matching import (
    anchored_mean_of_group,
    consensus_factor,
    contraction,
    group_of,
    groups,
)
from slowlink.algorithms.noloco import NoLoCo
from slowlink.algorithms.outer import OuterState, outer_nesterov

NAMES = ("emb", "blocks.0.w")


def starts(nodes: int, seed: int = 0, same: bool = True) -> list[dict]:
    rng = np.random.default_rng(seed)
    one = {
        "emb": rng.normal(size=(3, 4)).astype(np.float32),
        "blocks.0.w": rng.normal(size=5).astype(np.float32),
    }
    if same:
        return [{k: v.copy() for k, v in one.items()} for _ in range(nodes)]
    return [{k: rng.normal(size=v.shape).astype(np.float32) for k, v in one.items()} for _ in range(nodes)]


def train(params: dict, node: int, round_: int, steps: int = 3) -> dict:
    """H steps of SGD on node `node`'s own noisy quadratic ½‖θ − c‖², seeded by (node, round)."""
    rng = np.random.default_rng([node, round_])
    out = {k: v.copy() for k, v in params.items()}
    for _ in range(steps):
        for values in out.values():
            values -= np.float32(0.1) * (values - rng.normal(size=values.shape).astype(np.float32))
    return out


def lockstep_round(method, xs: list[dict], states: list[dict], round_: int) -> tuple[list[dict], list[dict]]:
    """One round of every node with every message on time: what the gossip driver does, all nodes at once."""
    nodes = len(xs)
    trained = [train(x, i, round_) for i, x in enumerate(xs)]
    deltas = [pseudo_gradient(x, t) for x, t in zip(xs, trained, strict=True)]
    mixed = {START: [dict(x) for x in xs], DELTA: [dict(d) for d in deltas]}
    for exchange in method.exchanges(list(NAMES), nodes):
        source = xs if exchange.carries == START else deltas
        drawn = groups(method.seed, round_, exchange.mix, nodes, exchange.size)
        for i in range(nodes):
            group = group_of(i, drawn)
            values = {j: {n: source[j][n] for n in exchange.names} for j in group}
            mixed[exchange.carries][i].update(method.mix(exchange, values))
    out = [method.update(xs[i], mixed[START][i], mixed[DELTA][i], states[i]) for i in range(nodes)]
    return [x for x, _ in out], [s for _, s in out]


def test_global_mixes_from_identical_starts_equal_diloco_bit_for_bit():
    nodes, rounds = 4, 3
    gossip = GossipDiLoCo(sync_every=3, mix1="global", mix2="global")
    diloco = sl.DiLoCo(sync_every=3, overlap_steps=0, quorum_size=nodes)
    xs = starts(nodes)
    states = [gossip.init_state(x) for x in xs]
    anchor, state = dict(xs[0]), diloco.init_state(xs[0])
    for r in range(rounds):
        xs, states = lockstep_round(gossip, xs, states, r)
        deltas = [pseudo_gradient(anchor, train(anchor, i, r)) for i in range(nodes)]
        anchor, state = diloco.outer_step(
            diloco.combine((d, 1.0) for d in deltas), state, anchor, flush_only=False
        )
    for x in xs:
        for name in NAMES:
            assert np.array_equal(x[name], anchor[name]), name


def test_the_diloco_variant_keeps_every_node_identical_and_equal_to_diloco():
    nodes = 4
    gossip = GossipDiLoCo(sync_every=3, variant="DiLoCo")
    assert (gossip.mix1, gossip.mix2, gossip.name) == (None, "global", "DiLoCo")
    xs = starts(nodes)
    states = [gossip.init_state(x) for x in xs]
    for r in range(3):
        xs, states = lockstep_round(gossip, xs, states, r)
    for x in xs[1:]:
        assert all(np.array_equal(x[name], xs[0][name]) for name in NAMES)


@pytest.mark.parametrize("nodes", [4, 8, 16])
def test_pairwise_averaging_contracts_disagreement_by_rho_in_expectation(nodes):
    rng = np.random.default_rng(nodes)
    xs = [{"x": rng.normal(size=6).astype(np.float64)} for _ in range(nodes)]
    stacked = np.stack([x["x"] for x in xs])
    spread = ((stacked - stacked.mean(0)) ** 2).sum()
    trials, ratio = 3000, 0.0
    for r in range(trials):
        drawn = groups(7, r, 1, nodes, 2)
        mixed = np.stack(
            [anchored_mean_of_group({j: xs[j] for j in group_of(i, drawn)})["x"] for i in range(nodes)]
        )
        ratio += ((mixed - stacked.mean(0)) ** 2).sum() / spread
    measured, expected = ratio / trials, contraction(nodes, 2)
    assert expected == pytest.approx((nodes - 2) / (2 * (nodes - 1)))
    assert measured == pytest.approx(expected, rel=0.05), (measured, expected)  # 0.333, 0.429, 0.467


def test_the_consensus_factor_of_each_variant():
    rho = contraction(8, 2)
    assert consensus_factor(contraction(8, 8), 0.0) == 1.0  # DiLoCo
    assert consensus_factor(0.0, rho) == pytest.approx(1.4286, abs=1e-4)  # GlobalM1LocalM2
    assert consensus_factor(0.0, 1.0) == 2.0  # GlobalM1
    assert consensus_factor(rho, rho) == pytest.approx(1.75)  # LocalM1M2
    assert consensus_factor(1.0, rho) == float("inf")  # no Mix1 and local Mix2


def test_groups_agree_without_talking_and_differ_by_round_and_mix():
    assert groups(3, 5, 1, 8, 2) == groups(3, 5, 1, 8, 2)
    assert groups(3, 5, 1, 8, 2) != groups(3, 5, 2, 8, 2)
    assert groups(3, 5, 1, 8, 2) != groups(3, 6, 1, 8, 2)
    drawn = groups(0, 0, 1, 7, 2)
    assert sorted(n for g in drawn for n in g) == list(range(7)) and sorted(map(len, drawn)) == [1, 2, 2, 2]


def test_no_mixing_leaves_each_node_on_its_own_trajectory():
    nodes = 4
    alone = GossipDiLoCo(sync_every=3, mix1=None, mix2=None, outer_lr=1.0, outer_momentum=0.0)
    assert alone.exchanges(list(NAMES), nodes) == ()
    xs = starts(nodes, same=False)
    states = [alone.init_state(x) for x in xs]
    solo = [dict(x) for x in xs]
    for r in range(3):
        xs, states = lockstep_round(alone, xs, states, r)
        solo = [train(x, i, r) for i, x in enumerate(solo)]  # lr 1, no momentum: x ← θ
    for x, own in zip(xs, solo, strict=True):
        assert all(np.allclose(x[name], own[name], atol=1e-6) for name in NAMES)


def test_noloco_with_the_group_of_all_is_heavy_ball_diloco():
    nodes = 4
    noloco = NoLoCo(sync_every=3, group_size=nodes, outer_lr=0.7, outer_momentum=0.5)
    heavy = outer_nesterov(0.7, 0.5, nesterov=False)
    xs = starts(nodes)
    states = [noloco.init_state(x) for x in xs]
    anchor, buffers = dict(xs[0]), heavy.init(xs[0])
    for r in range(4):
        xs, states = lockstep_round(noloco, xs, states, r)
        deltas = [pseudo_gradient(anchor, train(anchor, i, r)) for i in range(nodes)]
        mean = {n: sum(d[n] for d in deltas) / nodes for n in NAMES}
        anchor, buffers = heavy.update(mean, buffers, anchor)
    for x in xs:
        for name in NAMES:
            np.testing.assert_allclose(x[name], anchor[name], rtol=1e-5, atol=1e-6)
    assert isinstance(buffers, OuterState)


def test_mix2_params_restricts_mix2_to_the_tensors_it_finds():
    method = GossipDiLoCo(sync_every=2, variant="GlobalM1LocalM2", mix2_params=r"^emb")
    one, two = method.exchanges(list(NAMES), 8)
    assert (one.carries, one.size, one.blocking, one.names) == (START, 8, False, NAMES)
    assert (two.carries, two.size, two.blocking, two.names) == (DELTA, 2, True, ("emb",))
    with pytest.raises(sl.ConfigError, match="finds none"):
        GossipDiLoCo(sync_every=2, mix2_params="nothing").exchanges(list(NAMES), 8)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"variant": "Gossip"}, "variant"),
        ({"variant": "GlobalM1", "mix1": "pairs", "mix2": None}, "not both"),
        ({"mix1": "ring"}, "mix1"),
        ({"sync_every": 0}, "sync_every"),
        ({"fragments": 2}, "fragments=1"),
        ({"mix2_params": "("}, "regular expression"),
        ({"outer_momentum": 1.0}, "outer_momentum"),
        ({"nodes": 0}, "nodes"),
    ],
)
def test_bad_options_are_refused_by_name(options, match):
    with pytest.raises(sl.ConfigError, match=match):
        GossipDiLoCo(**({"sync_every": 4} | options))


def test_noloco_refuses_a_group_of_one():
    with pytest.raises(sl.ConfigError, match="group_size"):
        NoLoCo(sync_every=4, group_size=1)
