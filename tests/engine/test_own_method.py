"""A method of the test's own, written against algorithms/method.py alone: ParameterAverage (average the
nodes' parameters every H steps, no outer optimizer) runs over a MemoryMailbox with threads and over a
DirMailbox with two processes, and ends on the parameters a plain-torch replay computes."""

import copy
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import slowlink as sl
from slowlink.algorithms.merge import weighted_mean
from slowlink.algorithms.method import Method, Rounds, WireOptions
from slowlink.algorithms.partition import Schema
from slowlink.arrays import Arrays
from slowlink.protocol.run import read_commit, read_run

ROOT = Path(__file__).resolve().parents[2]  # the repository root, so that `tests.session` imports
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.session.nodes import batches, run_nodes, sgd_step, tiny_mlp  # noqa: E402

# ---- the method: all of it ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ParameterAverage:
    """Every `every` steps, all `nodes` nodes wait for each other and take the sample-weighted mean of
    their parameters; no outer optimizer, no state."""

    every: int
    nodes: int

    def to_dict(self) -> dict:
        return {"method": "ParameterAverage", "every": self.every, "nodes": self.nodes}

    def plan(self, schema: Schema) -> list[list[str]]:
        return [[name for name, _, _ in schema]]  # one fragment: every tensor syncs at once

    def rounds(self, fragments: int) -> Rounds:
        # A barrier (τ = 0) every H steps that waits for every node; a commit replaces θ (α = 0).
        return Rounds(sync_every=self.every, offsets=(0,) * fragments, in_flight=1, overlap_steps=0,
                      mixing=0.0, quorum_size=self.nodes, max_norm_ratio=None)  # fmt: skip

    def wire(self) -> WireOptions:
        return WireOptions()  # float32 both ways

    def weight(self, samples: int, steps: int) -> float:
        return float(samples)

    def combine(self, contributions: Iterable[tuple[Arrays, float]]) -> Arrays:
        return weighted_mean(contributions)  # Σ w·Δ / Σ w

    def init_state(self, anchor: Arrays) -> Arrays:
        return {}

    def outer_step(
        self, delta: Arrays, state: Arrays, anchor: Arrays, *, flush_only: bool, shape: object
    ) -> tuple[Arrays, Arrays]:
        # Δ_m = anchor − θ_m, so anchor − mean(Δ) is the weighted mean of the nodes' parameters.
        return {name: anchor[name] - delta[name] for name in anchor}, {}


# ---- the reference: the same training in plain torch, no slowlink -----------------------------------

EVERY, STEPS, NODES, LR = 3, 9, 2, 0.1
WORKER = Path(__file__).with_name("own_method_worker.py")


def reference_average(every: int, steps: int, nodes: int, lr: float = LR) -> dict[str, np.ndarray]:
    """Final parameters by name: replicas of tiny_mlp() train `every` SGD steps each on its own batches
    (tests/session/nodes.py), then all take the sample-weighted mean; repeated for `steps` steps."""
    average = tiny_mlp()
    node_batches = [batches(i, steps) for i in range(nodes)]
    for start in range(0, steps, every):
        replicas = [copy.deepcopy(average) for _ in range(nodes)]
        samples = []
        for i, replica in enumerate(replicas):
            for x, y in node_batches[i][start : start + every]:
                sgd_step(replica, (x, y), lr)
            samples.append(sum(len(x) for x, _ in node_batches[i][start : start + every]))
        weights = torch.tensor(samples, dtype=torch.float32) / sum(samples)
        with torch.no_grad():
            for p, *qs in zip(average.parameters(), *(r.parameters() for r in replicas), strict=True):
                p.copy_(sum(w * q for w, q in zip(weights, qs, strict=True)))
    return parameters(average)


def parameters(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: p.detach().numpy().copy() for name, p in model.named_parameters()}


def assert_same(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], atol=1e-6, rtol=0, err_msg=name)


def test_it_is_a_method_and_its_reference_is_not_trivial():
    assert isinstance(ParameterAverage(every=EVERY, nodes=NODES), Method)
    expected = reference_average(EVERY, STEPS, NODES)
    # Training moved it, and averaging matters: neither the start nor one node alone ends there.
    alone = tiny_mlp()
    for batch in batches(0, STEPS):
        sgd_step(alone, batch, LR)
    for other in (parameters(tiny_mlp()), parameters(alone)):
        assert max(np.abs(other[name] - expected[name]).max() for name in expected) > 1e-3


# ---- A: threads over a MemoryMailbox ---------------------------------------------------------------


def test_threads_over_a_memory_mailbox_end_on_the_reference():
    method, mailbox = ParameterAverage(every=EVERY, nodes=NODES), sl.MemoryMailbox()
    models, stats = run_nodes(NODES, method, mailbox, STEPS, lr=LR)
    expected = reference_average(EVERY, STEPS, NODES)
    finals = [parameters(model) for model in models]
    for final in finals:
        assert_same(final, finals[0])  # both nodes agree exactly
        assert_same(final, expected)
    rounds = STEPS // EVERY
    for round_ in range(1, rounds + 1):
        record = read_commit(mailbox, 0, round_)
        assert record is not None, f"round {round_} was not committed"
        assert [c["node"] for c in record["contributors"]] == ["node-0", "node-1"]
        assert [c["samples"] for c in record["contributors"]] == [EVERY * 4] * NODES
        assert record["outer_state"] is None  # the method keeps no state
    assert read_commit(mailbox, 0, rounds + 1) is None
    assert [s.commits_applied for s in stats] == [rounds] * NODES
    run = read_run(mailbox)
    assert run.config == {"method": "ParameterAverage", "every": EVERY, "nodes": NODES}
    assert len(run.plan) == 1


class HalfStep(ParameterAverage):
    """The same, but moving only half way to the mean: the engine must apply the method's outer_step."""

    def outer_step(self, delta, state, anchor, *, flush_only, shape):
        return {name: anchor[name] - 0.5 * delta[name] for name in anchor}, {}


def test_the_engine_applies_the_methods_own_outer_step():
    models, _ = run_nodes(NODES, HalfStep(every=EVERY, nodes=NODES), sl.MemoryMailbox(), STEPS, lr=LR)
    expected = reference_average(EVERY, STEPS, NODES)
    final = parameters(models[0])
    assert max(np.abs(final[name] - expected[name]).max() for name in expected) > 1e-3


# ---- B: two processes over a DirMailbox ------------------------------------------------------------


def test_two_processes_over_a_directory_end_on_the_reference(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    args = [[tmp_path / "run", i, NODES, EVERY, STEPS, LR, tmp_path / f"{i}.npz"] for i in range(NODES)]
    procs = [subprocess.Popen([sys.executable, str(WORKER), *map(str, a)], env=env) for a in args]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    expected = reference_average(EVERY, STEPS, NODES)
    for i in range(NODES):
        with np.load(tmp_path / f"{i}.npz", allow_pickle=False) as final:
            assert_same(dict(final), expected)
    mailbox = sl.DirMailbox(tmp_path / "run")
    assert read_run(mailbox).config["method"] == "ParameterAverage"
    for round_ in range(1, STEPS // EVERY + 1):
        assert [c["node"] for c in read_commit(mailbox, 0, round_)["contributors"]] == ["node-0", "node-1"]


# ---- C: the simulator (slowlink.sim) ----------------------------------------------------------------


def test_the_simulator_ends_on_the_reference():
    from slowlink import sim

    data = {i: batches(i, STEPS) for i in range(NODES)}

    def loss(model, batch):
        x, y = batch
        return ((model(x) - y) ** 2).mean()

    result = sim.run(ParameterAverage(every=EVERY, nodes=NODES), tiny_mlp, lambda node, step: data[node][step],
                     workers=NODES, steps=STEPS, loss=loss, optimizer=lambda p: torch.optim.SGD(p, lr=LR),
                     network=sim.Network(bandwidth="10Mbps", latency="40ms"))  # fmt: skip
    expected = reference_average(EVERY, STEPS, NODES)
    for model in result.models:
        assert_same(parameters(model), expected)
    assert [len(commit.contributors) for commit in result.commits] == [NODES] * (STEPS // EVERY)
