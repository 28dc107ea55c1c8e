"""An MLX node (in a process without torch) and a PyTorch node train one run over a directory: every round
merges both, both learn, and the committed model loads into either framework with the very same values."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

mx = pytest.importorskip(
    "mlx.core", reason="needs MLX: pip install 'mlx[cpu]' on Linux (the mlx and dev extras)"
)

import slowlink as sl  # noqa: E402
from slowlink.frameworks.base import adapter_for  # noqa: E402
from slowlink.protocol.chain import newest_params  # noqa: E402
from slowlink.protocol.run import read_run  # noqa: E402

from . import two_frameworks  # noqa: E402
from .two_frameworks import mlx_model, torch_model  # noqa: E402

NODE = Path(__file__).with_name("two_frameworks.py")
STEPS, ROUNDS = 30, 6  # sync_every=5


def test_an_mlx_node_and_a_torch_node_train_together_and_their_commit_loads_identically_into_both(tmp_path):
    mailbox = tmp_path / "run"
    # The MLX node, in its own process, where torch cannot be imported, creates the run; the torch node, in
    # this one, joins it.
    args = {"node": 0, "steps": STEPS, "mailbox": str(mailbox), "events": str(tmp_path / "mlx.events")}
    mlx_node = subprocess.Popen([sys.executable, str(NODE), json.dumps({**args, "framework": "mlx"}),
                                 str(tmp_path / "mlx.json")])  # fmt: skip
    try:
        two_frameworks.main({**args, "framework": "torch", "node": 1, "wait_for_run": True,
                             "events": str(tmp_path / "torch.events")}, tmp_path / "torch.json")  # fmt: skip
    finally:
        assert mlx_node.wait(timeout=240) == 0
    results = {
        framework: json.loads((tmp_path / f"{framework}.json").read_text()) for framework in ("mlx", "torch")
    }

    # Every round was closed on both nodes' contributions (quorum 2, a barrier each round).
    commits = sorted((mailbox / "commits" / "0000").glob("*.json"))
    assert len(commits) == ROUNDS
    for path in commits:
        contributors = {entry["node"] for entry in json.loads(path.read_text())["contributors"]}
        assert contributors == {"mlx-0", "torch-1"}, (path.name, (tmp_path / "mlx.events").read_text())
    for framework, result in results.items():
        assert result["versions"] == [ROUNDS] and result["commits_applied"] == ROUNDS, framework
        assert result["contributions_sent"] == ROUNDS, framework
        first, last = np.mean(result["losses"][:5]), np.mean(result["losses"][-5:])
        assert last < 0.5 * first, (framework, first, last)  # each learns, from the run's shared model

    # The committed model, loaded by sl.align into a fresh model of each framework (of another seed).
    run = read_run(sl.DirMailbox(mailbox))
    names = [name for name, _, _ in run.schema]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias"]  # made by the MLX node, in torch's names
    _, committed = newest_params(sl.DirMailbox(mailbox), run, 0, ROUNDS)
    torch_fresh, mlx_fresh = torch_model(seed=7), mlx_model(seed=7)
    assert sl.align(torch_fresh, mailbox=mailbox) == {0: ROUNDS}
    assert sl.align(mlx_fresh, mailbox=mailbox) == {0: ROUNDS}
    in_torch = {name: p.detach().numpy() for name, p in torch_fresh.named_parameters()}
    in_mlx = adapter_for(mlx_fresh).snapshot(names)
    for name in names:
        assert np.array_equal(in_torch[name], committed[name]), name
        assert np.array_equal(in_mlx[name], committed[name]), name
    # One layout in both: the committed model computes the same function in either framework.
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(np.array(mlx_fresh(mx.array(x))), torch_fresh(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    # Each node ended on the last commit: its last step was a sync, and it aligned with that round's commit.
    for result in results.values():
        for name in names:
            np.testing.assert_allclose(
                np.array(result["final"][name], np.float32), committed[name], atol=1e-6
            )
