"""slowlink.sim: M virtual workers in one process, on virtual clocks, over a modelled network, running the
real method and engine code on real models (run.py); no threads, no sleeping. For example

    result = sim.run(sl.DiLoCo(sync_every=50), make_model, batches, workers=4, step_seconds=[1, 1, 1, 2],
                     network=sim.Network(bandwidth="100Mbps", latency="30ms"), steps=2000, seed=0)

and sim.run_demo(make_model, batches, workers=4, steps=200, lr=1e-3, topk=8) for DeMo (demo.py). Gossip
methods (sl.GossipDiLoCo, sl.NoLoCo) run through sim.run_gossip, with the same arguments (gossip.py).
"""

from .gossip import GossipResult, GossipWorkerReport, run_gossip
from .hub import CommitLog
from .network import Network, Store
from .run import SimResult, WorkerReport, run


def __getattr__(name: str):
    # run_demo runs sl.DeMo, a torch optimizer: imported on first use, so `import slowlink.sim` needs no torch.
    if name in ("run_demo", "DeMoSimResult"):
        from . import demo as module

        return getattr(module, name)
    raise AttributeError(f"module 'slowlink.sim' has no attribute {name!r}")


__all__ = ["CommitLog", "DeMoSimResult", "GossipResult", "GossipWorkerReport", "Network", "SimResult", "Store",
           "WorkerReport", "run", "run_demo", "run_gossip"]  # fmt: skip
