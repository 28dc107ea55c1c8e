"""The plan: every method's utilization at each bandwidth, the time to train a token budget, the
bandwidth each needs for 50–99% utilization, and one recommendation per bandwidth with its reason.

Methods (research/algorithms.md §1, §2, §4): DP (bf16 gradients every step), DiLoCo (bf16, blocking),
Streaming DiLoCo (P strided fragments, τ = 0), + overlap (τ), + overlap + FP4 (slowlink's F4), and
Factored Gossip DiLoCo's GlobalM1 (parameters all-reduced during a whole round, nothing blocks).
Time to train = tokens / (M · batch tokens) steps × T_c / CU. The recommendation rule: recommend.py.
"""

from dataclasses import dataclass, field

from ..errors import ConfigError
from .model import ENCODING_BITS, Cluster, Method
from .search import bandwidth_for, model_named

NEEDED_TARGETS = (0.50, 0.80, 0.90, 0.95, 0.99)


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


def methods_for(request: PlanRequest, sync_every: int, overlap_steps: int | None = None) -> list[Method]:
    """The DiLoCo family at one H, simplest first; `overlap_steps` overrides the request's τ."""
    h, p = sync_every, request.fragments_for(sync_every)
    tau = request.overlap_steps if overlap_steps is None else overlap_steps
    return [
        Method(name="diloco", label="DiLoCo", sync_every=h),
        Method(name="streaming", label="Streaming DiLoCo", sync_every=h, fragments=p),
        Method(name="streaming-overlap", label="Streaming + overlap", sync_every=h, fragments=p,
               overlap_steps=tau),
        Method(name="streaming-overlap-fp4", label="Streaming + overlap + FP4", sync_every=h, fragments=p,
               overlap_steps=tau, encoding="F4", bits=ENCODING_BITS["F4"]),
        Method(name="globalm1", label="FGDiLoCo GlobalM1", sync_every=h, overlap_steps=h),
    ]  # fmt: skip


@dataclass(frozen=True)
class Row:
    """One method at one H: utilization at each requested bandwidth, the bandwidth it needs for each
    of NEEDED_TARGETS (None: unreachable), and the time to train the token budget at each bandwidth."""

    method: Method
    utilization: tuple[float, ...]
    needed: dict[float, float | None]
    train_seconds: tuple[float, ...] | None


@dataclass(frozen=True)
class Recommendation:
    bandwidth: float
    method: Method
    utilization: float
    reaches_target: bool
    reason: str
    config: str | None


@dataclass(frozen=True)
class Plan:
    request: PlanRequest
    rows: list[Row]
    recommendations: list[Recommendation] = field(default_factory=list)


def evaluate(request: PlanRequest, method: Method) -> Row:
    model, cluster = model_named(request.model), request.cluster
    utilization = tuple(model(cluster, method, w) for w in request.bandwidths)
    needed = {t: bandwidth_for(t, cluster, method, model) for t in NEEDED_TARGETS}
    seconds = None
    if request.tokens is not None and request.batch_tokens is not None:
        steps = request.tokens / (cluster.workers * request.batch_tokens)
        seconds = tuple(steps * cluster.step_time / max(cu, 1e-300) for cu in utilization)
    return Row(method=method, utilization=utilization, needed=needed, train_seconds=seconds)


def make_plan(request: PlanRequest) -> Plan:
    """Evaluate DP once and the DiLoCo family at each H, then recommend per bandwidth."""
    from .recommend import recommend  # recommend reads Plan's parts; imported here to avoid a cycle

    rows = [evaluate(request, data_parallel())]
    for h in request.sync_every:
        rows.extend(evaluate(request, method) for method in methods_for(request, h))
    plan = Plan(request=request, rows=rows)
    return Plan(request=request, rows=rows, recommendations=recommend(plan))
