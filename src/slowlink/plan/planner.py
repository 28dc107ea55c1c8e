"""The plan: every method's utilization at each bandwidth, the time to train a token budget, the
bandwidth each needs for 50–99% utilization, and one recommendation per bandwidth (recommend.py).

Time to train = tokens / (M · batch tokens) steps × T_c / CU; bandwidth needed: search.py.
"""

from dataclasses import dataclass

from .model import Method
from .recommend import Recommendation, recommend
from .request import PlanRequest, data_parallel, methods_for
from .search import bandwidth_for, model_named

NEEDED_TARGETS = (0.50, 0.80, 0.90, 0.95, 0.99)


@dataclass(frozen=True)
class Row:
    """One method at one H: utilization at each requested bandwidth, the bandwidth it needs for each
    of NEEDED_TARGETS (None: unreachable), and the time to train the token budget at each bandwidth."""

    method: Method
    utilization: tuple[float, ...]
    needed: dict[float, float | None]
    train_seconds: tuple[float, ...] | None


@dataclass(frozen=True)
class Plan:
    request: PlanRequest
    rows: list[Row]
    recommendations: list[Recommendation]


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
    rows = [evaluate(request, data_parallel())]
    for h in request.sync_every:
        rows.extend(evaluate(request, method) for method in methods_for(request, h))
    return Plan(request=request, rows=rows, recommendations=recommend(request))
