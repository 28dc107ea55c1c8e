"""The gossip driver (engine/gossip.py) over the in-memory peer exchange (engine/peers.py): four threads that
wait for every mix end on the simulator's bits, and a refused payload makes its receiver mix with itself."""

import sys
import threading
from pathlib import Path

import numpy as np
import torch

import slowlink as sl
from slowlink import sim
from slowlink.clock import REAL
from slowlink.engine.gossip import GossipNode
from slowlink.engine.peers import Board, MemoryPeers
from slowlink.frameworks.base import adapter_for

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.session.nodes import batches, tiny_mlp  # noqa: E402

NODES, STEPS = 4, 8


def mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def threads(method, board: Board) -> tuple[list, list[GossipNode]]:
    models, nodes = [tiny_mlp() for _ in range(NODES)], [None] * NODES
    for i in range(NODES):
        nodes[i] = GossipNode(node_id=f"node-{i}", method=method, adapter=adapter_for(models[i]),
                              exchange=MemoryPeers(board, i, NODES), clock=REAL, emit=lambda event: None)  # fmt: skip

    def train(i: int) -> None:
        optimizer = torch.optim.SGD(models[i].parameters(), lr=0.1)
        for batch in batches(i, STEPS):
            optimizer.zero_grad()
            mse(models[i], batch).backward()
            optimizer.step()
            nodes[i].step(samples=len(batch[0]))

    workers = [threading.Thread(target=train, args=(i,)) for i in range(NODES)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    return models, nodes


def test_threads_that_wait_for_every_mix_end_on_the_simulators_bits():
    method = sl.GossipDiLoCo(sync_every=4, variant="GlobalM1LocalM2", mix1_seconds=30.0)
    models, _ = threads(method, Board())
    data = {w: batches(w, STEPS) for w in range(NODES)}
    simulated = sim.run_gossip(method, tiny_mlp, lambda w, s: data[w][s], workers=NODES, steps=STEPS, loss=mse,
                               optimizer=lambda params: torch.optim.SGD(params, lr=0.1))  # fmt: skip
    for ours, theirs in zip(models, simulated.models, strict=True):
        for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
            assert np.array_equal(p.detach().numpy(), q.detach().numpy()), name


def test_a_refused_payload_is_left_out_and_counted_by_its_reason():
    def refuse_rank_3(round_, carries, rank, values):
        return "corrupt: the test refuses it" if rank == 3 else None

    method = sl.NoLoCo(
        sync_every=4, group_size=NODES, mix_seconds=10.0
    )  # one group of all: everyone hears rank 3
    _, nodes = threads(method, Board(check=refuse_rank_3))
    # 2 rounds, 2 exchanges each: ranks 0-2 left rank 3 out 4 times; rank 3 heard everyone.
    assert [dict(node.counters.self_mixed) for node in nodes] == [{"corrupt": 4}] * 3 + [{}]
