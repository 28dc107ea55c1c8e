"""The report's plots, drawn with matplotlib (Agg: files only) and returned as PNG bytes: rounds and
their contributors over time with stalls and leader changes marked, bytes per node, and loss."""

from __future__ import annotations

import io

WIDTH, DPI = 9.6, 100  # 960 pixels wide: the report's column


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    _pyplot().close(figure)
    return buffer.getvalue()


def plot_rounds(timeline: list[list], stalls: list[dict], leader_changes: list[dict]) -> bytes:
    """timeline: [time, fragment, round, contributors, rejected, merger] per commit; stalls: {"start",
    "seconds"}; leader_changes: {"time", "to"}. Times are seconds since the epoch; drawn from the first."""
    plt = _pyplot()
    figure, (rounds, people) = plt.subplots(2, 1, figsize=(WIDTH, 5.6), sharex=True, height_ratios=[3, 2])
    start = min(entry[0] for entry in timeline)
    fragments = sorted({entry[1] for entry in timeline})
    for fragment in fragments:
        points = sorted((entry[0] - start, entry[2]) for entry in timeline if entry[1] == fragment)
        rounds.step([x for x, _ in points], [y for _, y in points], where="post", marker="o", ms=3,
                    label=f"fragment {fragment}")  # fmt: skip
    rejected = [(entry[0] - start, entry[2]) for entry in timeline if entry[4]]
    if rejected:
        rounds.plot(*zip(*rejected, strict=True), "x", color="crimson", ms=8, label="round with a rejection")
    nodes = sorted({node for entry in timeline for node in entry[3]})
    row = {node: i for i, node in enumerate(nodes)}
    for fragment in fragments:
        xs, ys = [], []
        for entry in timeline:
            if entry[1] == fragment:
                xs += [entry[0] - start] * len(entry[3])
                ys += [row[node] for node in entry[3]]
        people.scatter(xs, ys, s=12, label=f"fragment {fragment}")
    people.set_yticks(range(len(nodes)), nodes)
    people.set_ylim(-0.7, len(nodes) - 0.3)
    for axes in (rounds, people):
        for stall in stalls:
            axes.axvspan(
                stall["start"] - start, stall["start"] - start + stall["seconds"], color="orange", alpha=0.25
            )
        for change in leader_changes:
            if change.get("time") is not None:
                axes.axvline(change["time"] - start, color="purple", ls="--", lw=1)
        axes.grid(alpha=0.3)
    if stalls:
        rounds.plot([], [], color="orange", alpha=0.4, lw=8, label="stall")
    if any(change.get("time") is not None for change in leader_changes):
        rounds.plot([], [], color="purple", ls="--", lw=1, label="leader change")
    rounds.set_ylabel("newest round")
    rounds.legend(loc="upper left", fontsize=8)
    rounds.set_title("rounds committed over time, and the nodes each one merged")
    people.set_ylabel("contributors")
    people.set_xlabel("seconds since the first commit")
    figure.tight_layout()
    return _png(figure)


def plot_bytes(per_node: dict[str, int], *, what: str) -> bytes:
    plt = _pyplot()
    names = sorted(per_node)
    figure, axes = plt.subplots(figsize=(WIDTH, 1.2 + 0.35 * len(names)))
    scale, unit = next((s, u) for s, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "bytes"))
                       if max(per_node.values()) >= s or s == 1)  # fmt: skip
    axes.barh(names, [per_node[name] / scale for name in names], color="C0")
    axes.invert_yaxis()
    axes.set_xlabel(f"{unit} ({what})")
    axes.set_title("bytes per node")
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    return _png(figure)


def plot_loss(series: dict[tuple[str, str], list[tuple[int, float]]]) -> bytes:
    """series: (node, figure name) -> [(step, value)], from the events files' `scalars` lines."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(WIDTH, 3.8))
    for (node, name), points in sorted(series.items()):
        points = sorted(points)
        axes.plot([step for step, _ in points], [value for _, value in points], "-", marker="." if len(points) < 50 else None,
                  label=f"{node} {name.replace('_', ' ')}")  # fmt: skip
    axes.set_xlabel("local step")
    axes.set_ylabel("loss")
    axes.set_title("loss as logged by the nodes")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    return _png(figure)
