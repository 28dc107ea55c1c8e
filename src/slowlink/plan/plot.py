"""A PNG of compute utilization against bandwidth, one line per method (colour) and H (line style),
with the requested bandwidths marked. Needs matplotlib (the dev extra); imported only when drawing."""

from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .planner import Plan
from .search import model_named
from .units import format_bandwidth, format_count

COLORS = {  # matplotlib's tab10, one per method
    "dp": "#1f77b4",
    "diloco": "#ff7f0e",
    "streaming": "#2ca02c",
    "streaming-overlap": "#d62728",
    "streaming-overlap-fp4": "#9467bd",
    "globalm1": "#8c564b",
}
STYLES = ["-", "--", ":", "-."]
SIZE_INCHES, DPI = (9.0, 5.5), 100  # 900 × 550 pixels
POINTS = 121


def bandwidth_axis(plan: Plan) -> np.ndarray:
    """Bits/s from a decade under the lowest request to a decade over the highest, log-spaced."""
    low, high = min(plan.request.bandwidths), max(plan.request.bandwidths)
    return np.logspace(np.log10(low) - 1, np.log10(high) + 1, POINTS)


def plot_utilization(plan: Plan, path: str | Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib, which is not installed: pip install matplotlib "
            "(or slowlink[dev]), or leave out --plot"
        ) from None
    model, cluster = model_named(plan.request.model), plan.request.cluster
    axis = bandwidth_axis(plan)
    hs = sorted(plan.request.sync_every)
    figure, ax = plt.subplots(figsize=SIZE_INCHES, dpi=DPI)
    for row in plan.rows:
        method = row.method
        style = "-" if method.name == "dp" else STYLES[hs.index(method.sync_every) % len(STYLES)]
        values = [100 * model(cluster, method, w) for w in axis]
        name = method.label if method.name == "dp" else f"{method.label}, H={method.sync_every}"
        ax.plot(axis, values, style, color=COLORS[method.name], linewidth=2, label=name)
    for w in plan.request.bandwidths:
        ax.axvline(w, color="0.6", linewidth=1, linestyle=":")
        ax.text(w, 103, format_bandwidth(w), rotation=90, va="bottom", ha="center", fontsize=8)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(lambda value, _: format_bandwidth(value))
    ax.set_ylim(0, 102)
    ax.set_xlabel("bandwidth of each worker's link")
    ax.set_ylabel("compute utilization (%)")
    title = f"{format_count(cluster.params)} parameters, {cluster.workers} workers"
    title += f", {cluster.step_time:.3g} s of compute a step"
    ax.set_title(title, pad=40)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=DPI)
    plt.close(figure)
    return out
