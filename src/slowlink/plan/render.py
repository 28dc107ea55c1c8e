"""The plan as text for people and as JSON for programs (docs/planning.md lists the JSON fields)."""

import json
import textwrap

from .planner import NEEDED_TARGETS, Plan, Row
from .recommend import describe
from .units import format_bandwidth, format_count, format_duration, format_percent

MODEL_NOTES = {
    "timeline": "per-layer event simulation of forward, backward and reductions on one link",
    "closed-form": "the timeline's steady state in closed form",
    "first-order": "the research notes' one-line formulas, no per-layer overlap (pessimistic)",
}


def _header(plan: Plan) -> list[str]:
    request, cluster = plan.request, plan.request.cluster
    fragments = sorted({request.fragments_for(h) for h in request.sync_every})
    return [
        f"slowlink plan: {format_count(cluster.params)} parameters in {cluster.layers} layers, "
        f"{cluster.workers} workers, {cluster.step_time:.3g} s of compute a step ({request.step_time_note})",
        f"  link: each worker's own, full duplex; ring all-reduce sends 2(M-1)/M = "
        f"{cluster.ring_factor:.3g} bytes a byte; latency {cluster.latency * 1e3:.3g} ms a hop",
        f"  model: {request.model} ({MODEL_NOTES[request.model]})",
        f"  Streaming: {'/'.join(map(str, fragments))} strided fragments, overlap τ = "
        f"{request.overlap_steps}; FP4 is slowlink's F4 (4.25 bits a value), everything else bf16",
    ]


def _table(headers: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(line[i]) for line in [headers, *body]) for i in range(len(headers))]

    def line(cells):  # first column left-aligned, numbers right-aligned
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(headers), line(["-" * w for w in widths]), *(line(cells) for cells in body)]


def _label(row: Row) -> list[str]:
    return [row.method.label, str(row.method.sync_every)]


def render_text(plan: Plan) -> str:
    request = plan.request
    columns = ["method", "H", *(format_bandwidth(w) for w in request.bandwidths)]
    out = _header(plan) + ["", "Compute utilization"]
    out += _table(columns, [_label(r) + [f"{cu:.1%}" for cu in r.utilization] for r in plan.rows])
    if request.tokens is not None and request.batch_tokens is not None:
        steps = request.tokens / (request.cluster.workers * request.batch_tokens)
        title = f"Time to train {format_count(request.tokens)} tokens ({request.batch_tokens:,.0f} tokens "
        out += ["", title + f"a worker a step, {format_count(steps)} steps), at compute / utilization"]
        body = [_label(r) + [format_duration(s) for s in r.train_seconds or ()] for r in plan.rows]
        out += _table(columns, body)
    out += ["", "Bandwidth needed for a compute utilization of"]
    needed_columns = ["method", "H", *(format_percent(t) for t in NEEDED_TARGETS)]
    body = [_label(r) + [format_bandwidth(r.needed[t]) for t in NEEDED_TARGETS] for r in plan.rows]
    out += _table(needed_columns, body)
    out += ["", f"Recommendation (target {format_percent(request.target)} compute utilization)"]
    for pick in plan.recommendations:
        out.append(f"  at {format_bandwidth(pick.bandwidth)}: {describe(pick.method)}, "
                   f"{pick.method.encoding} ({pick.utilization:.1%})")  # fmt: skip
        out += textwrap.wrap(pick.reason, 106, initial_indent="    why: ", subsequent_indent="         ")
        out.append(f"    use: {pick.config or _no_config(pick.method.name)}")
    return "\n".join(out)


def _no_config(name: str) -> str:
    if name == "dp":
        return "plain data-parallel training (e.g. torch DDP); slowlink is not needed"
    return "Factored Gossip DiLoCo is not in slowlink's API yet"


def _method_dict(row_method) -> dict:
    m = row_method
    return {"name": m.name, "label": m.label, "sync_every": m.sync_every, "fragments": m.fragments,
            "overlap_steps": m.overlap_steps, "encoding": m.encoding, "bits_per_value": m.bits}  # fmt: skip


def plan_dict(plan: Plan) -> dict:
    """Everything in the plan as plain JSON types; bandwidths in bits/s, times in seconds."""
    request, cluster = plan.request, plan.request.cluster
    inputs = {
        "params": cluster.params, "layers": cluster.layers, "step_time_s": cluster.step_time,
        "step_time_source": request.step_time_note, "workers": cluster.workers,
        "latency_s": cluster.latency, "bandwidths_bps": list(request.bandwidths),
        "sync_every": list(request.sync_every), "overlap_steps": request.overlap_steps,
        "tokens": request.tokens, "batch_tokens": request.batch_tokens, "target": request.target,
        "model": request.model,
    }  # fmt: skip
    rows = []
    for row in plan.rows:
        entry = {"method": _method_dict(row.method), "utilization": list(row.utilization)}
        entry["bandwidth_needed_bps"] = {f"{t:.2f}": row.needed[t] for t in NEEDED_TARGETS}
        entry["train_seconds"] = list(row.train_seconds) if row.train_seconds is not None else None
        rows.append(entry)
    picks = [
        {"bandwidth_bps": p.bandwidth, "method": _method_dict(p.method), "utilization": p.utilization,
         "reaches_target": p.reaches_target, "reason": p.reason, "config": p.config}
        for p in plan.recommendations
    ]  # fmt: skip
    return {"inputs": inputs, "rows": rows, "recommendations": picks}


def render_json(plan: Plan) -> str:
    return json.dumps(plan_dict(plan), indent=2)
