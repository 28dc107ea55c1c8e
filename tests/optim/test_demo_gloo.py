"""Two real gloo processes on 127.0.0.1 end with the parameters the same two nodes reach in one process."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.optim.nodes import train
from tests.optim.threads import ThreadedGroup, run_threads

ROOT = Path(__file__).parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_processes_match_two_nodes_in_one_process(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    outs = [tmp_path / f"node{rank}.safetensors" for rank in range(2)]
    nodes = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "tests/optim/gloo_node.py"), str(r), str(port), str(outs[r])],
            env=env,
            cwd=ROOT,
        )  # fmt: skip
        for r in range(2)
    ]
    assert [node.wait(timeout=240) for node in nodes] == [0, 0]
    group, threads = ThreadedGroup(2), torch.get_num_threads()
    torch.set_num_threads(1)  # the nodes' own setting: a sign step turns any rounding difference into ±lr
    try:
        expected = run_threads([lambda r=r: train(r, group.member(r), values="2bit") for r in range(2)])
    finally:
        torch.set_num_threads(threads)
    for rank in range(2):
        got = load_file(outs[rank])
        for name, tensor in expected[rank].items():
            assert torch.allclose(got[name], tensor, atol=1e-6), name
    # and the two nodes agree: every node applies the same averaged step
    for name in expected[0]:
        assert torch.allclose(expected[0][name], expected[1][name], atol=1e-6)
