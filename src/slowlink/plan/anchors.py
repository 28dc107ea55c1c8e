"""Published numbers the planner is checked against, typed in from research/algorithms.md, with the
settings each source states and, where it states none, the assumption taken (docs/planning.md).

Streaming DiLoCo (Douillard et al., arXiv 2501.18512), Table 4 (algorithms.md §2.5): Gbit/s needed for
compute utilization 50/80/90/95/99% at 1B/10B/100B. Stated: layers 24/48/108, step times 0.1/0.8/4.9 s,
3-layer fragments (8/16/36) synced one every 11/5/2 steps (⌊H/(P+1)⌋), H = 100. Not stated in the
notes, taken from the public re-simulation (research/anchors.md): M = 2, bf16 = 16 bits, FP4 = 4 bits,
τ = 1, no latency. Assumed: N = 1e9/1e10/1e11 exactly, layers of equal size.

Factored Gossip DiLoCo blog (seeds/000, algorithms.md §4.5): 1.5B parameters, M = 8, H = 100; the
2.4 s step is the notes' inference from DiLoCo's 53%; the batch is not given (see FGDILOCO_BATCH).
"""

from dataclasses import dataclass

from .model import Cluster, Method
from .search import Model, bandwidth_for
from .timeline import utilization

TABLE4_TARGETS = (0.50, 0.80, 0.90, 0.95, 0.99)
TABLE4_SCALES = ("1B", "10B", "100B")
TABLE4_ROWS = ("Data-Parallel", "DiLoCo", "Streaming", "+ overlap", "+ overlap + FP4")
TABLE4_GBITS = {  # row -> scale -> Gbit/s at each target, as printed
    "Data-Parallel": {
        "1B": (86.8, 152.6, 184.2, 222.3, 569.0),
        "10B": (104.8, 222.3, 222.3, 268.3, 471.5),
        "100B": (184.2, 323.8, 390.7, 390.7, 471.5),
    },
    "DiLoCo": {
        "1B": (1.4, 6.2, 13.3, 23.3, 86.8),
        "10B": (1.7, 7.5, 16.0, 33.9, 104.8),
        "100B": (3.0, 11.0, 23.3, 49.4, 184.2),
    },
    "Streaming": {
        "1B": (1.4, 5.2, 9.1, 16.0, 28.1),
        "10B": (1.7, 5.2, 9.1, 13.3, 19.3),
        "100B": (2.4, 6.2, 9.1, 11.0, 19.3),
    },
    "+ overlap": {
        "1B": (1.4, 4.3, 6.2, 9.1, 11.0),
        "10B": (1.7, 3.6, 5.2, 6.2, 7.5),
        "100B": (1.7, 3.6, 4.3, 5.2, 5.2),
    },
    "+ overlap + FP4": {
        "1B": (0.4, 0.9, 1.7, 2.0, 3.0),
        "10B": (0.4, 0.9, 1.4, 1.4, 1.7),
        "100B": (0.5, 0.9, 1.1, 1.1, 1.4),
    },
}
# scale -> (parameters, layers, step time in seconds, layer fragments)
TABLE4_SHAPES = {"1B": (1e9, 24, 0.1, 8), "10B": (1e10, 48, 0.8, 16), "100B": (1e11, 108, 4.9, 36)}
TABLE4_SYNC_EVERY = 100


def table4_cluster(scale: str) -> Cluster:
    params, layers, step_time, _ = TABLE4_SHAPES[scale]
    return Cluster(params=params, layers=layers, step_time=step_time, workers=2, latency=0.0)


def table4_method(row: str, scale: str) -> Method:
    fragments = TABLE4_SHAPES[scale][3]
    spacing = TABLE4_SYNC_EVERY // (fragments + 1)  # the paper's 11/5/2: one slot for the embeddings
    h = TABLE4_SYNC_EVERY
    streaming = dict(sync_every=h, fragments=fragments, spacing=spacing)
    return {
        "Data-Parallel": lambda: Method(name="dp", label=row),
        "DiLoCo": lambda: Method(name="diloco", label=row, sync_every=h),
        "Streaming": lambda: Method(name="streaming", label=row, **streaming),
        "+ overlap": lambda: Method(name="streaming-overlap", label=row, overlap_steps=1, **streaming),
        "+ overlap + FP4": lambda: Method(
            name="streaming-overlap-fp4", label=row, overlap_steps=1, encoding="FP4 (E3M0)", bits=4.0,
            **streaming,
        ),
    }[row]()  # fmt: skip


@dataclass(frozen=True)
class Cell:
    row: str
    scale: str
    target: float
    paper_gbits: float
    model_gbits: float

    @property
    def ratio(self) -> float:
        """How far apart, as a factor ≥ 1 whichever side is larger."""
        return max(self.model_gbits / self.paper_gbits, self.paper_gbits / self.model_gbits)


def table4(model: Model = utilization) -> list[Cell]:
    """Every cell of Table 4 beside the bandwidth `model` needs for the same utilization."""
    cells = []
    for row in TABLE4_ROWS:
        for scale in TABLE4_SCALES:
            cluster, method = table4_cluster(scale), table4_method(row, scale)
            for target, paper in zip(TABLE4_TARGETS, TABLE4_GBITS[row][scale], strict=True):
                needed = bandwidth_for(target, cluster, method, model)
                assert needed is not None  # no latency: every target is reachable
                cells.append(Cell(row, scale, target, paper, needed / 1e9))
    return cells


# FGDiLoCo blog: utilization at H = 100, M = 8, 1.5B parameters; (method, bits/s) -> CU as reported.
FGDILOCO_UTILIZATION = {
    ("diloco", 200e6): 0.53,
    ("diloco", 100e6): 0.36,
    ("globalm1", 200e6): 1.00,
    ("dp", 100e6): 0.01,
}
FGDILOCO_WEEKS_1T_AT_200M = {"globalm1": 16.0, "diloco": 29.0}
# The blog gives no batch. 16 weeks at 100% CU and 2.4 s a step imply 1e12·2.4/(16·604800) ≈ 248k
# tokens per step over the 8 workers; we take 2^18 = 262,144 (32 sequences of 1,024 tokens a worker).
FGDILOCO_BATCH = 32 * 1024
FGDILOCO_CLUSTER = Cluster(params=1.5e9, layers=26, step_time=2.4, workers=8, latency=0.0)


def table4_markdown(model: Model = utilization) -> str:
    """Table 4 beside the model, as the Markdown table docs/planning.md shows."""
    lines = ["| method | scale | " + " | ".join(f"{t:.0%}" for t in TABLE4_TARGETS) + " |"]
    lines.append("|" + " --- |" * (2 + len(TABLE4_TARGETS)))
    cells = table4(model)
    for row in TABLE4_ROWS:
        for scale in TABLE4_SCALES:
            mine = [c for c in cells if c.row == row and c.scale == scale]
            text = [f"{c.paper_gbits:g} / {c.model_gbits:.3g}{' **' if c.ratio > 1.2 else ''}" for c in mine]
            lines.append(f"| {row} | {scale} | " + " | ".join(text) + " |")
    ratios = [c.ratio for c in cells]
    worst = max(cells, key=lambda c: c.ratio)
    lines.append("")
    lines.append(
        f"Within 1.2×: {sum(r <= 1.2 for r in ratios)} of {len(cells)}; within 1.5×: "
        f"{sum(r <= 1.5 for r in ratios)}; worst: {worst.row}, {worst.scale}, {worst.target:.0%} "
        f"({worst.paper_gbits:g} against {worst.model_gbits:.3g} Gbit/s, {worst.ratio:.3f}×)."
    )
    return "\n".join(lines)
