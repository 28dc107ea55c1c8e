"""Which method and settings to use at each bandwidth, and why.

Candidates are ordered by what they are expected to cost in loss, least first, and the first to reach
the target utilization wins; if none does, the one with the highest utilization. The order, from the
sources' quality results (research/algorithms.md):
    1. DP (exact);
    2. for each H, smallest first (DiLoCo: H = 1000 costs +2.9% perplexity against H = 50, §1):
       DiLoCo, Streaming DiLoCo (no loss at equal H, §2.5), + overlap with τ from the requested value
       up to min(5, s − 1) (τ ≤ 5 costs < 0.2% loss, §2.3), then the same with FP4 (no regression, §2.4);
    3. for each H: GlobalM1 (perplexity 19.42 against DiLoCo's 18.65 at 10B tokens, loss spikes, §4.5).
"""

from dataclasses import dataclass, replace

from .model import Method
from .request import PlanRequest, data_parallel, methods_for
from .search import bandwidth_for, model_named
from .units import format_bandwidth, format_percent

MAX_OVERLAP = 5  # the paper's advice: τ ≤ 5; beyond it little utilization is gained


@dataclass(frozen=True)
class Recommendation:
    bandwidth: float
    method: Method
    utilization: float
    reaches_target: bool
    reason: str
    config: str | None


WHY = {
    "dp": "every step is exact, so nothing is lost to local steps",
    "diloco": "outer syncs every H steps match data-parallel loss closely (DiLoCo paper)",
    "streaming": "fragments cut peak bandwidth at no loss against DiLoCo (Streaming DiLoCo paper)",
    "streaming-overlap": "a fragment may land τ steps late; τ ≤ 5 costs < 0.2% loss (Streaming DiLoCo)",
    "streaming-overlap-fp4": "4-bit outer gradients showed no loss regression (Streaming DiLoCo §2.4)",
    "globalm1": "nothing blocks, but expect a perplexity cost (19.4 against DiLoCo's 18.7 at 10B "
    "tokens, FGDiLoCo blog) and watch for loss spikes",
}


def candidates(request: PlanRequest) -> list[Method]:
    """Every option, in the order above."""
    ordered = [data_parallel()]
    for h in sorted(request.sync_every):
        family = methods_for(request, h)
        spacing = family[1].step_spacing
        top = max(request.overlap_steps, min(MAX_OVERLAP, spacing - 1))
        overlaps = range(request.overlap_steps, top + 1)
        ordered += family[:2]
        ordered += [replace(family[2], overlap_steps=tau) for tau in overlaps]
        ordered += [replace(family[3], overlap_steps=tau) for tau in overlaps]
    ordered += [methods_for(request, h)[4] for h in sorted(request.sync_every)]
    return ordered


def recommend(request: PlanRequest) -> list[Recommendation]:
    """One pick per requested bandwidth."""
    model = model_named(request.model)
    options = candidates(request)
    picks = []
    for w in request.bandwidths:
        scored = [(method, model(request.cluster, method, w)) for method in options]
        reaching = [(m, cu) for m, cu in scored if cu >= request.target]
        method, cu = reaching[0] if reaching else max(scored, key=lambda pair: pair[1])
        reason = _reason(request, w, method, cu, scored, bool(reaching))
        config = slowlink_config(method, request.cluster.workers)
        picks.append(Recommendation(w, method, cu, bool(reaching), reason, config))
    return picks


def describe(method: Method) -> str:
    """ "Streaming + overlap + FP4, H=100, 9 fragments, τ=2"."""
    parts = [method.label]
    if method.sync_every > 1:
        parts.append(f"H={method.sync_every}")
    if method.fragments > 1:
        parts.append(f"{method.fragments} fragments")
    if 0 < method.overlap_steps < method.sync_every:
        parts.append(f"τ={method.overlap_steps}")
    return ", ".join(parts)


def _reason(request: PlanRequest, w: float, method: Method, cu: float, scored, reached: bool) -> str:
    at, target = format_bandwidth(w), format_percent(request.target)
    simpler = [(m, c) for m, c in scored[: [m for m, _ in scored].index(method)]]
    best_simpler = {}
    for m, c in simpler:  # the best each simpler method manages, at any H and τ
        if m.name not in best_simpler or c > best_simpler[m.name][1]:
            best_simpler[m.name] = (m, c)
    others = "; ".join(f"{describe(m)} {c:.1%}" for m, c in best_simpler.values())
    if reached:
        text = f"{describe(method)} keeps compute {cu:.1%} busy at {at}, the first option (in order of "
        text += f"expected loss) to reach the {target} target: {WHY[method.name]}."
        return text + (f" Simpler options reach only: {others}." if others else "")
    needed = bandwidth_for(request.target, request.cluster, method, model_named(request.model))
    return (
        f"Nothing reaches the {target} target at {at}; {describe(method)} does best at {cu:.1%} and needs "
        f"{format_bandwidth(needed)} for {target}: {WHY[method.name]}."
    )


def slowlink_config(method: Method, workers: int) -> str | None:
    """The `sl.DiLoCo(...)` that runs this method; None where slowlink has no such method."""
    if method.name in ("dp", "globalm1"):
        return None
    options = [f"sync_every={method.sync_every}"]
    if method.fragments > 1:
        options += [f"fragments={method.fragments}", "partition=sl.Strided()"]
    options.append(f"overlap_steps={method.overlap_steps}")
    if method.overlap_steps:
        options.append("mixing=0.5")
    options.append(f"quorum_size={workers}")
    if method.encoding == "F4":
        options.append('delta_dtype="F4"')
    return f"sl.DiLoCo({', '.join(options)})"
