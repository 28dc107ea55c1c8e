"""The bench measures the real code: the simulator's DiLoCo run ends on the parameters two real processes reach
through a DirMailbox, and so does its sparse (TopK) DiLoCo, whose payloads, error feedback and lossy commits
take other paths; the DeMo simulator's nodes end where two gloo processes end; all to 1e-6. The bench's gossip
entries run the engine that tests/protocol/test_gossip_processes.py holds to the simulator's bits. All six
processes run at once, beside the in-process runs, so the test costs one process start."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from slowlink.bench.registry import METHODS, diloco
from slowlink.bench.runners import simulate, simulate_demo

from .nodes import CONFIG, parameters, task

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(kind: str, rank: int, where: str, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    script = str(ROOT / "tests" / "bench" / "nodes.py")
    return subprocess.Popen([sys.executable, script, kind, str(rank), where, str(out)], env=env, cwd=ROOT)


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def test_the_simulated_diloco_and_demo_end_where_real_processes_end(tmp_path):
    port, workers = str(free_port()), CONFIG.workers
    processes = [start(entry, r, str(tmp_path / entry), tmp_path / f"{entry}-{r}.st")
                 for entry in ("diloco", "diloco-topk") for r in range(workers)]  # fmt: skip
    processes += [start("demo", r, port, tmp_path / f"demo-{r}.st") for r in range(workers)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the processes' setting: the same kernels, the same rounding
    try:
        bench = task()
        simulated = simulate(diloco(CONFIG), bench, CONFIG, [CONFIG.step_time] * workers)
        sparse = simulate(METHODS["diloco-topk"].method(CONFIG), bench, CONFIG, [CONFIG.step_time] * workers)
        demo_models = simulate_demo(bench, CONFIG).models
    finally:
        torch.set_num_threads(threads)
    assert [p.wait(timeout=240) for p in processes] == [0] * len(processes)
    start_model = parameters(bench.make_model())
    for rank in range(workers):
        real = load_file(tmp_path / f"diloco-{rank}.st")
        assert largest_difference(real, parameters(simulated.models[rank])) < 1e-6
        real_sparse = load_file(tmp_path / f"diloco-topk-{rank}.st")
        assert largest_difference(real_sparse, parameters(sparse.models[rank])) < 1e-6
        assert largest_difference(real_sparse, real) > 1e-3  # the sparse Δs did change the training
        assert (
            largest_difference(load_file(tmp_path / f"demo-{rank}.st"), parameters(demo_models[rank])) < 1e-6
        )
        # not trivially equal: both trained away from the start
        assert largest_difference(real, start_model) > 1e-3
        assert largest_difference(parameters(demo_models[rank]), start_model) > 1e-3
    # every simulated round merged both workers: the schedule the real barrier runs
    assert len(simulated.commits) == CONFIG.steps // CONFIG.sync_every
    assert all(len(commit.contributors) == workers for commit in simulated.commits)
