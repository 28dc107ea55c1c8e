"""One node of test_gossip_processes: trains tiny_mlp with each gossip variant in turn, each over its own
DirMailbox, and writes its held-out losses and stats to a JSON file. Run as:
python gossip_worker.py MAILBOX_DIR NODE NODES OUT_JSON (the repository root on PYTHONPATH)."""

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

import slowlink as sl
from tests.session.nodes import batches, sgd_step, tiny_mlp

METHODS = {
    "DiLoCo": lambda nodes: sl.GossipDiLoCo(sync_every=4, variant="DiLoCo", nodes=nodes),
    "GlobalM1": lambda nodes: sl.GossipDiLoCo(sync_every=4, variant="GlobalM1", nodes=nodes),
    "GlobalM1LocalM2": lambda nodes: sl.GossipDiLoCo(sync_every=4, variant="GlobalM1LocalM2", nodes=nodes),
    "LocalM1M2": lambda nodes: sl.GossipDiLoCo(sync_every=4, variant="LocalM1M2", nodes=nodes),
    "NoLoCo": lambda nodes: sl.NoLoCo(sync_every=4, nodes=nodes),
    # Every mix waited for (Mix1 too): a run whose result does not depend on timing, for the simulator to match.
    "exact": lambda nodes: sl.GossipDiLoCo(sync_every=4, variant="LocalM1M2", nodes=nodes, mix1_seconds=60.0),
}
STEPS = 16


def mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def held_out_loss(model) -> float:
    x, y = batches(99, 1, size=64)[0]
    with torch.no_grad():
        return float(((model(x) - y) ** 2).mean())


def main(directory: str, node: int, nodes: int, out: str) -> None:
    torch.set_num_threads(1)
    results = {}
    for name, method in METHODS.items():
        model, folder = tiny_mlp(), Path(directory) / name
        before = held_out_loss(model)
        with sl.Session(model, algorithm=method(nodes), mailbox=sl.DirMailbox(folder), node_id=f"node-{node}",
                        poll_seconds=0.01) as session:  # fmt: skip
            while len(list((folder / "gossip" / "ranks").glob("*.json"))) < nodes:
                time.sleep(0.01)  # the roster is whole before anyone trains, so round 0 mixes everyone
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for batch in batches(node, STEPS):
                if name == "exact":  # as the simulator trains
                    optimizer.zero_grad()
                    mse(model, batch).backward()
                    optimizer.step()
                else:
                    sgd_step(model, batch, 0.1)
                session.step(samples=len(batch[0]))
            stats = session.stats
        results[name] = {"before": before, "after": held_out_loss(model), "stats": asdict(stats),
                         "params": {k: p.detach().numpy().tolist() for k, p in model.named_parameters()}}  # fmt: skip
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    directory, node, nodes, out = sys.argv[1:]
    main(directory, int(node), int(nodes), out)
