"""DiLoCo over a 2-rank gloo group (sl.collective.AllReduce) ends on the parameters of the same run over a
MemoryMailbox with quorum = every node, and the quantized all-reduce stays within its encoding's bound."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import slowlink as sl
from slowlink.collective.quantized import dequantize, error_bound, quantize
from tests.collective.diloco_nodes import train
from tests.optim.test_demo_gloo import free_port
from tests.optim.threads import run_threads

ROOT = Path(__file__).parents[2]


def test_diloco_over_a_gloo_group_equals_diloco_over_a_mailbox_with_quorum_all(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    outs = [str(tmp_path / f"rank{rank}.safetensors") for rank in range(2)]
    script = str(ROOT / "tests/collective/allreduce_node.py")
    procs = [
        subprocess.Popen([sys.executable, script, str(r), str(port), outs[r]], env=env, cwd=ROOT)
        for r in range(2)
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mailbox = sl.MemoryMailbox()
        runs = run_threads([lambda r=r: train(r, mailbox=mailbox) for r in range(2)])
        expected, stats = [params for params, _ in runs], [stats for _, stats in runs]
    finally:
        torch.set_num_threads(threads)
    assert [proc.wait(timeout=240) for proc in procs] == [0, 0]
    for rank in range(2):
        got = load_file(outs[rank])
        for name, tensor in expected[rank].items():
            assert torch.allclose(got[name], tensor, atol=1e-6, rtol=0), (
                rank,
                name,
                (got[name] - tensor).abs().max(),
            )
    # 8-bit rounds: every rank applies the same dequantized merge, so the ranks agree exactly.
    quantized = [load_file(out.replace(".safetensors", "-8bit.safetensors")) for out in outs]
    assert all(torch.equal(quantized[0][name], quantized[1][name]) for name in quantized[0])
    assert any(not torch.allclose(quantized[0][name], expected[0][name], atol=1e-7) for name in quantized[0])
    # The quantized all-reduce over the group: within its bound, on 1-D, 2-D and 4-D tensors, for both ranks.
    for out in outs:
        found = json.loads(Path(out.replace(".safetensors", ".json")).read_text())
        for key, (ratio, error, bound) in found["errors"].items():
            assert ratio <= 1.0 + 1e-4 and error > 0, (key, ratio, error, bound)
        # 16 steps, H = 4: fragment 0 syncs at steps 4, 8, 12, 16, fragment 1 at 6, 10, 14; as over the mailbox
        assert found["sent"] == found["applied"] == stats[0].contributions_sent == 7
        assert found["bytes_sent"] > 0
        assert "'weight' is a DTensor" in found["refused"] and "island=" in found["refused"]


def test_quantized_codes_stand_for_each_value_within_half_a_step():
    generator = torch.Generator().manual_seed(3)
    for bits, levels in ((8, 127), (4, 7)):
        for shape in [(513,), (9, 31), (2, 3, 4, 5)]:
            x = torch.randn(shape, generator=generator) * 3
            codes, scales = quantize(x, bits, block=64)
            assert codes.dtype == torch.uint8 and codes.numel() == scales.numel() * 64 * bits // 8
            back = dequantize(codes, scales, bits, x.shape, block=64)
            bound = error_bound([x], bits, block=64)
            assert back.shape == x.shape
            assert ((back - x).abs() <= bound * (1 + 1e-5) + 1e-7).all()
            # the bound is half a step, and it is tight: some value is off by more than a tenth of it
            assert torch.allclose(bound.max(), x.abs().max() / levels / 2)
            assert ((back - x).abs() > bound / 10).any()
    zeros = torch.zeros(10)
    assert torch.equal(dequantize(*quantize(zeros, 4, block=4), 4, zeros.shape, block=4), zeros)


def test_a_group_run_or_an_island_without_a_process_group_is_refused_naming_the_fix():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(sl.ConfigError, match="init_process_group"):
        sl.Session(model, algorithm=sl.DiLoCo(sync_every=2), mailbox=sl.MemoryMailbox(), island=object())
    with pytest.raises(sl.ConfigError, match="init_process_group"):
        sl.collective.AllReduce()
    with pytest.raises(sl.ConfigError, match="bits must be None"):
        sl.collective.AllReduce(bits=3)
