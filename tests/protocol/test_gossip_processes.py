"""Four processes train each gossip variant over a DirMailbox (sl.Session with sl.GossipDiLoCo / sl.NoLoCo):
every node ends on a lower held-out loss than it started from, and Mix1 never made a training thread wait."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from slowlink import sim
from slowlink.algorithms.gossip import GossipDiLoCo

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
NODES = 4

from tests.protocol.gossip_worker import STEPS, mse  # noqa: E402
from tests.session.nodes import batches, tiny_mlp  # noqa: E402


def test_four_processes_train_every_gossip_variant_over_a_directory(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    worker = ROOT / "tests" / "protocol" / "gossip_worker.py"
    outs = [tmp_path / f"node-{i}.json" for i in range(NODES)]
    processes = [
        subprocess.Popen(
            [sys.executable, str(worker), str(tmp_path / "runs"), str(i), str(NODES), str(outs[i])], env=env
        )
        for i in range(NODES)
    ]
    for process in processes:
        assert process.wait(timeout=240) == 0
    results = [json.loads(out.read_text()) for out in outs]
    for variant in ("DiLoCo", "GlobalM1", "GlobalM1LocalM2", "LocalM1M2", "NoLoCo", "exact"):
        for node in results:
            found = node[variant]
            assert found["after"] < found["before"], (variant, found)
            assert found["stats"]["rounds"] == 4 and found["stats"]["step"] == 16
            if variant != "exact":  # which waits for Mix1 on purpose
                assert found["stats"]["mix1_stall_seconds"] == 0.0, (variant, found["stats"])
    # With the blocking mix, every node waits for its group's Δ (60 s at most): none was left out of Mix2,
    # and the DiLoCo variant's nodes, mixing Δ over all four, end on the same parameters' loss.
    assert len({round(node["DiLoCo"]["after"], 6) for node in results}) == 1
    assert all(node["DiLoCo"]["stats"]["self_mixed"] == {} for node in results)
    assert all(node["GlobalM1LocalM2"]["stats"]["bytes_sent"]["blocking"] > 0 for node in results)
    assert all("blocking" not in node["GlobalM1"]["stats"]["bytes_sent"] for node in results)

    # The run that waits for every mix ends, on every node, on the very bits the simulator computes (worker w of
    # the simulator is the node that claimed rank w).
    node_of = {node["exact"]["stats"]["rank"]: i for i, node in enumerate(results)}
    data = {w: batches(node_of[w], STEPS) for w in range(NODES)}
    simulated = sim.run_gossip(
        GossipDiLoCo(sync_every=4, variant="LocalM1M2", nodes=NODES, mix1_seconds=60.0), tiny_mlp,
        lambda w, s: data[w][s], workers=NODES, steps=STEPS, loss=mse,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    )  # fmt: skip
    for w, model in enumerate(simulated.models):
        ours = results[node_of[w]]["exact"]["params"]
        for name, p in model.named_parameters():
            assert np.array_equal(np.asarray(ours[name], dtype=np.float32), p.detach().numpy()), (w, name)
