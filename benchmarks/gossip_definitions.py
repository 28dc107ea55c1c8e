"""The figures that pin the gossip methods to their definitions, for docs/BENCHMARKS.md (benchmarks/gossip_lm.py
prints them beside its own): the contraction ρ of random pairs measured over seeded rounds, and the consensus
distance of each variant on a noisy quadratic with 8 workers in the simulator (as tests/sim/test_gossip_sim.py).
"""

import numpy as np
import torch

import slowlink as sl
from slowlink import sim
from slowlink.algorithms.matching import (
    anchored_mean_of_group,
    consensus_factor,
    contraction,
    group_of,
    groups,
)

D = 16
OPTIMUM = torch.linspace(-1, 1, D)


def measured_rho(nodes: int, trials: int = 3000) -> float:
    """E‖(W−J)X‖² / ‖(I−J)X‖² over `trials` seeded pair matchings, for one random X."""
    rng = np.random.default_rng(nodes)
    xs = [{"x": rng.normal(size=6)} for _ in range(nodes)]
    stacked = np.stack([x["x"] for x in xs])
    spread, total = ((stacked - stacked.mean(0)) ** 2).sum(), 0.0
    for r in range(trials):
        drawn = groups(7, r, 1, nodes, 2)
        mixed = np.stack(
            [anchored_mean_of_group({j: xs[j] for j in group_of(i, drawn)})["x"] for i in range(nodes)]
        )
        total += ((mixed - stacked.mean(0)) ** 2).sum() / spread
    return total / trials


class Quadratic(torch.nn.Module):
    """½‖w − c‖² with c drawn around OPTIMUM at each step: a noisy quadratic whose optimum is known."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(D))

    def forward(self, target: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((self.w - target) ** 2).sum()


def noisy(worker: int, step: int) -> tuple[torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * worker + step)
    return (OPTIMUM + torch.randn(D, generator=generator),)


def quadratic_consensus(variant: str) -> float:
    method = sl.GossipDiLoCo(sync_every=5, variant=variant)
    result = sim.run_gossip(method, Quadratic, noisy, workers=8, steps=50, samples=lambda batch: 1,
                            optimizer=lambda params: torch.optim.SGD(params, lr=0.05))  # fmt: skip
    return float(np.mean([value for round_, value in result.consensus if round_ >= 3]))


def definitions_markdown() -> str:
    rho = contraction(8, 2)
    factors = {"DiLoCo": 1.0, "GlobalM1LocalM2": consensus_factor(0.0, rho), "LocalM1M2": consensus_factor(rho, rho),
               "GlobalM1": consensus_factor(0.0, 1.0)}  # fmt: skip
    rows = [f"| {m} | {(m - 2) / (2 * (m - 1)):.4f} | {measured_rho(m):.4f} |" for m in (4, 8, 16)]
    quad = [f"| {v} | {f:.2f} | {quadratic_consensus(v):.4f} |" for v, f in factors.items()]
    return "\n".join(
        ["Contraction of random pairs, 3000 seeded matchings (`tests/algorithms/test_gossip.py` asserts 5%):", "",
         "| M | ρ = (M−2)/(2(M−1)) | measured |", "| --- | --- | --- |", *rows, "",
         "Consensus distance (relative L2 of the round starts, rounds 3–10) on a noisy quadratic, 8 workers, H = 5, "
         "SGD lr 0.05 (`tests/sim/test_gossip_sim.py` pins these values):", "",
         "| variant | F | consensus |", "| --- | --- | --- |", *quad]
    )  # fmt: skip


if __name__ == "__main__":
    print(definitions_markdown())
