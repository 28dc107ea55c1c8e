"""The examples run as a reader would run them, in their short forms, and say what they promise: the loss
falls, the nodes agree, and the committed model evaluates well (BatchNorm's statistics included)."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, *args: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    done = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_the_batchnorm_example_synchronizes_the_running_statistics_and_the_commit_scores_in_eval_mode():
    out = run_example("batchnorm.py", "--steps", "40")
    nodes = re.findall(r"node-\d: last loss ([\d.]+), versions \[(\d+)\], running_mean\[:3\] (\[.*\])", out)
    assert len(nodes) == 2, out
    assert nodes[0][1:] == nodes[1][1:], out  # the same commit, the same running statistics
    assert all(float(loss) < 0.5 for loss, _, _ in nodes), out  # from ln(4) = 1.39
    fresh = float(re.search(r"a fresh model in eval mode: accuracy ([\d.]+)", out).group(1))
    committed = float(
        re.search(r"committed model at versions .*, in eval mode: accuracy ([\d.]+)", out).group(1)
    )
    initial_statistics = float(re.search(r"initial statistics: accuracy ([\d.]+)", out).group(1))
    assert fresh < 0.5 and committed >= 0.95, out
    assert initial_statistics < committed - 0.05, out  # the statistics align loaded are what make it score


def test_the_hugging_face_trainer_example_learns_on_both_nodes_and_commits_a_better_model():
    pytest.importorskip("transformers", reason="examples/hf_trainer.py needs transformers (the dev extra)")
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (the dev extra)")
    out = run_example("hf_trainer.py", "--steps", "20")
    nodes = re.findall(r"node-\d: loss ([\d.]+) -> ([\d.]+), (\d+) samples, (\d+) commits applied", out)
    assert len(nodes) == 2, out
    for first, last, samples, commits in nodes:
        # Against a fresh model's ln(256) = 5.5, not the node's first logged loss: a node that joins after
        # the other's first commit starts from it (its first loss is then already about 3.4)
        assert float(last) < math.log(256) - 1.0 and float(first) > float(last), out
        assert int(samples) == 20 * 8 and int(commits) >= 1, out  # 4 per device x 2 accumulated, each step
    before, after = map(
        float, re.search(r"held-out loss: ([\d.]+) at the start, ([\d.]+) committed", out).groups()
    )
    assert after < before - 1.0, out


def test_the_torch_and_mlx_learners_train_one_run_and_commit_one_model_that_scores_alike_in_both(tmp_path):
    pytest.importorskip(
        "mlx.core", reason="examples/mlx_learner.py needs MLX: pip install 'mlx[cpu]' on Linux"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    learners = [subprocess.Popen([sys.executable, str(ROOT / "examples" / name), "--mailbox", str(tmp_path / "run"),
                                  "--steps", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env)  # fmt: skip
                for name in ("torch_learner.py", "mlx_learner.py")]  # fmt: skip
    outs = []
    for learner in learners:
        out, err = learner.communicate(timeout=300)
        assert learner.returncode == 0, out[-2000:] + err[-3000:]
        outs.append(out)
    out = "".join(outs)
    trained = re.findall(
        r"(torch|mlx) node: loss ([\d.]+) -> ([\d.]+), (\d+) commits applied, versions \[(\d+)\]", out
    )
    assert sorted(node for node, *_ in trained) == ["mlx", "torch"], out
    assert all(float(last) < float(first) and int(commits) == 3 == int(version)
               for _, first, last, commits, version in trained), out  # fmt: skip
    fresh = [float(x) for x in re.findall(r"node: a fresh model: held-out loss ([\d.]+)", out)]
    committed = re.findall(r"node: committed model at versions \{0: 3\}: held-out loss ([\d.]+)", out)
    assert len(committed) == 2 and committed[0] == committed[1], out  # one model, the same score in both
    assert all(float(committed[0]) < 0.5 * loss for loss in fresh), out
