"""Real learner processes over a DirMailbox: the run learns, pays against one process alone for the same
wall time, its nodes agree on the committed model, and a late joiner starts from the committed model."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import slowlink as sl
from slowlink.demo.corpus import TrainWindows, heldout_windows, load_corpus
from slowlink.demo.model import build_model, evaluate, make_optimizer, train_step

from .worker_process import learning_rate

WORKER = Path(__file__).with_name("worker_process.py")
BATCH = 1


def launch(
    mailbox: Path, node: int, steps: int, algorithm: dict, out: Path, wait_for: int = 0
) -> subprocess.Popen:
    args = {"mailbox": str(mailbox), "node": node, "steps": steps, "batch": BATCH, "algorithm": algorithm,
            "wait_for_nodes": wait_for}  # fmt: skip
    return subprocess.Popen([sys.executable, str(WORKER), json.dumps(args), str(out)])


def single_process_loss(seconds: float) -> float:
    """Held-out loss of one process training alone for `seconds` of a dedicated core.

    Time is CPU time, of the whole process on both sides, so the comparison means "the same wall time
    on a core of its own" even when the machine running the tests is busy with other work.
    """
    torch.set_num_threads(1)
    model = build_model("tiny", seed=0)
    optimizer = make_optimizer(model)
    windows = TrainWindows(load_corpus(), node=0)
    deadline = time.process_time() + seconds
    step = 0
    while time.process_time() < deadline:
        train_step(model, optimizer, windows.next_batch(BATCH), lr=learning_rate(step))
        step += 1
    return evaluate(model, heldout_windows(load_corpus()))


def run(tmp_path: Path, nodes: int, steps: int, *, late: int | None = None) -> tuple[list[dict], float]:
    mailbox = tmp_path / "run"
    # Standard DiLoCo (a barrier each round, every node in it) over two fragments. Plain averaging as the
    # outer step pays within a few hundred steps; Nesterov needs longer runs. Steps here take ~6 ms, so a
    # round's latency spans many steps: without the barrier, the carried overlap would dominate.
    algorithm = {"sync_every": 20, "fragments": 2, "quorum_size": nodes, "overlap_steps": 0,
                 "outer_lr": 1.0, "outer_momentum": 0.0}  # fmt: skip
    started = time.perf_counter()
    # Without a late joiner every node waits for the others' leases before training: the run is then the same
    # whatever the machine's load, and only the single process's share of it varies.
    wait_for = nodes if late is None else 0
    procs = [
        launch(mailbox, i, steps, algorithm, tmp_path / f"{i}.json", wait_for)
        for i in range(nodes)
        if i != late
    ]
    if late is not None:
        while (
            not any((mailbox / "commits" / "0000").glob("*.json"))
            or len(list((mailbox / "commits").glob("*/*.json"))) < 2
        ):
            time.sleep(0.2)  # two rounds committed before the late node starts
        procs.append(launch(mailbox, late, steps // 2, algorithm, tmp_path / f"{late}.json"))
    for proc in procs:
        assert proc.wait(timeout=240) == 0
    wall = time.perf_counter() - started
    return [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(nodes)], wall


@pytest.mark.parametrize("nodes", [2, 4])
def test_processes_over_a_directory_learn_pay_against_one_process_and_agree(tmp_path, nodes):
    results, _ = run(tmp_path, nodes, steps=400)
    committed = build_model("tiny", seed=0)
    start_loss = evaluate(committed, heldout_windows(load_corpus()))
    versions = sl.align(committed, mailbox=sl.DirMailbox(tmp_path / "run"))
    loss = evaluate(committed, heldout_windows(load_corpus()))
    assert loss < start_loss - 0.5, (start_loss, loss)
    # Distribution must pay: the same wall time of training in one process gets a higher held-out loss.
    alone = single_process_loss(max(r["trained_seconds"] for r in results))
    assert loss < alone, (loss, alone)
    # Every node left aligned with a commit of the one shared history: its parameters are that commit's,
    # bit for bit, and the last node to leave holds the newest.
    assert all(r["final_is_committed"] for r in results)
    by_versions = {}
    for r in results:
        by_versions.setdefault(tuple(r["final_versions"]), set()).add(r["final_digest"])
    assert all(len(digests) == 1 for digests in by_versions.values())  # same commit, same bits
    assert max(tuple(r["final_versions"]) for r in results) == tuple(versions.values())
    assert sum(r["stats"]["rounds_merged"] for r in results) == sum(versions.values())
    for r in results:
        assert r["stats"]["contributions_rejected"] == 0


def test_a_late_joiner_starts_from_the_committed_model(tmp_path):
    results, _ = run(tmp_path, 3, steps=100, late=2)
    late = results[2]
    assert sum(late["joined_versions"]) >= 2
    assert late["joined_model_is_committed"]
    assert all(r["joined_model_is_committed"] for r in results)  # whoever joins starts from the commit
