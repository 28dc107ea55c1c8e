"""What to plan for (a cluster, bandwidths, the H values, fragments, τ, a token budget, a target) and
the methods compared at each H (research/algorithms.md §1, §2, §4; docs/planning.md):
DP (bf16 gradients every step), DiLoCo (bf16, blocking), Streaming DiLoCo (P strided fragments, τ = 0),
+ overlap (τ), + overlap + FP4 (slowlink's F4), and Factored Gossip DiLoCo's GlobalM1 (the round's
start parameters all-reduced while the round trains: τ = H, nothing blocks).
"""

from dataclasses import dataclass

from ..errors import ConfigError
from .model import ENCODING_BITS, Cluster, Method
from .search import model_named


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What to plan for. batch_tokens: tokens each worker trains on per step; fragments None is
    one per 3 layers, as in the Streaming DiLoCo paper; target: the utilization to recommend for."""

    cluster: Cluster
    bandwidths: tuple[float, ...]
    sync_every: tuple[int, ...] = (100,)
    fragments: int | None = None
    overlap_steps: int = 1
    tokens: float | None = None
    batch_tokens: float | None = None
    target: float = 0.9
    model: str = "timeline"
    step_time_note: str = "given"

    def __post_init__(self) -> None:
        model_named(self.model)
        if not self.bandwidths:
            raise ConfigError("--bandwidth needs at least one bandwidth, e.g. --bandwidth 100Mbps,1Gbps")
        if self.tokens is not None and self.batch_tokens is None:
            raise ConfigError(
                "--tokens needs --batch-tokens (tokens each worker trains on per step) to count the steps"
            )
        for h in self.sync_every:
            if not 0 <= self.overlap_steps < h:
                raise ConfigError(
                    f"--overlap-steps {self.overlap_steps} must be below --sync-every {h} (0 blocks at once)"
                )

    def fragments_for(self, sync_every: int) -> int:
        wanted = self.fragments if self.fragments is not None else max(1, round(self.cluster.layers / 3))
        if wanted > self.cluster.layers:
            raise ConfigError(
                f"--fragments {wanted} exceeds --layers {self.cluster.layers}; a fragment holds whole layers"
            )
        return min(wanted, sync_every)


def data_parallel() -> Method:
    return Method(name="dp", label="Data-parallel (DDP)")


def methods_for(request: PlanRequest, sync_every: int) -> list[Method]:
    """The DiLoCo family at one H, simplest first."""
    h, p, tau = sync_every, request.fragments_for(sync_every), request.overlap_steps
    return [
        Method(name="diloco", label="DiLoCo", sync_every=h),
        Method(name="streaming", label="Streaming DiLoCo", sync_every=h, fragments=p),
        Method(name="streaming-overlap", label="Streaming + overlap", sync_every=h, fragments=p,
               overlap_steps=tau),
        Method(name="streaming-overlap-fp4", label="Streaming + overlap + FP4", sync_every=h, fragments=p,
               overlap_steps=tau, encoding="F4", bits=ENCODING_BITS["F4"]),
        Method(name="globalm1", label="FGDiLoCo GlobalM1", sync_every=h, overlap_steps=h),
    ]  # fmt: skip
