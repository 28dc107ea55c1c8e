"""Two real processes, first over gloo on 127.0.0.1 and then over a DirMailbox, end both runs with the parameters the
same two nodes reach in the simulator (sim.run_demo)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from slowlink import DirMailbox, sim
from tests.optim.nodes import LR, OPTIONS, STEPS, batch, model, mse

ROOT = Path(__file__).parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gloo_and_mailbox_processes_match_the_simulator(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    port, store = str(free_port()), tmp_path / "store"
    nodes = [
        subprocess.Popen([sys.executable, str(ROOT / "tests/optim/gloo_node.py"), str(r), port, str(store),
                          str(tmp_path / f"node{r}-")], env=env, cwd=ROOT)
        for r in range(2)
    ]  # fmt: skip
    assert [node.wait(timeout=300) for node in nodes] == [0, 0]
    runs = {
        (how, r): tmp_path / f"node{r}-{how}.safetensors" for how in ("gloo", "mailbox") for r in range(2)
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the nodes' own setting: a sign step turns any rounding difference into ±lr
    try:
        simulated = sim.run_demo(model, batch, workers=2, steps=STEPS, lr=LR, loss=mse, **OPTIONS)
    finally:
        torch.set_num_threads(threads)
    for (how, rank), out in runs.items():
        got = load_file(out)
        for name, p in simulated.models[rank].named_parameters():
            assert torch.allclose(got[name], p.detach(), atol=1e-6), (how, rank, name)
    # the two nodes agree (every node applies the same averaged step), and the step moved them
    first, second = (dict(m.named_parameters()) for m in simulated.models)
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not torch.equal(first["0.weight"], model()[0].weight)
    # the mailbox kept only the last keep_steps=2 steps of each node's payloads
    assert sorted(key.key for key in DirMailbox(str(store)).list("demo/")) == [
        f"demo/{step:012d}/{rank:05d}" for step in (STEPS - 2, STEPS - 1) for rank in range(2)
    ]
    # the simulator counted every step's bytes: each worker's payload sent, and received by the other
    reports = simulated.workers
    assert reports[0].bytes_sent + reports[1].bytes_sent == 2 * sum(simulated.bytes_per_step)
    assert (reports[0].bytes_received, reports[1].bytes_received) == (
        reports[1].bytes_sent,
        reports[0].bytes_sent,
    )
    assert simulated.optimizers[0].stats["sent_bytes"] == reports[0].bytes_sent
