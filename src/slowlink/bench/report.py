"""What a person sees of the bench: a live table while it runs (plain lines when not on a terminal), then
the Markdown table, the legend and one PNG of three plots: training loss per step, per simulated hour, and
the bytes each worker moved. Rendering only; the numbers come from run.py's BenchResult."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.filesize import decimal
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from ..plan.units import format_bandwidth, format_duration
from .registry import METHODS
from .run import BenchResult

COLUMNS = ["method", "held-out loss", "vs DDP", "bytes per worker", "DDP ÷ this", "peak bytes per sync",
           "simulated time", "utilization"]  # fmt: skip


class LiveView:
    """Per method: progress, and once done its held-out loss and simulated time."""

    def __init__(self, console: Console) -> None:
        self.console, self.live, self.rows = console, None, {}
        self.plain = not console.is_terminal or console.is_dumb_terminal

    def start(self, names: list[str]) -> None:
        self.rows = {name: {"done": 0, "total": 1, "result": ""} for name in names}
        if not self.plain:
            self.live = Live(get_renderable=self._render, console=self.console, refresh_per_second=4)
            self.live.start()

    def begin(self, name: str, summary: str) -> None:
        if self.plain:
            self.console.print(f"bench: {name} ({summary}) ...", highlight=False)

    def progress(self, name: str, done: int, total: int) -> None:
        self.rows[name].update(done=done, total=total)

    def done(self, outcome) -> None:
        text = (f"held-out {outcome.heldout_loss:.4f}, {format_duration(outcome.simulated_seconds)} simulated, "
                f"{outcome.real_seconds:.0f} s here ({outcome.cpu_seconds:.0f} s of CPU)")  # fmt: skip
        self.rows[outcome.name]["result"] = text
        if self.plain:
            self.console.print(f"bench: {outcome.name} done: {text}", highlight=False)

    def end(self) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
            self.live = None

    def _render(self) -> Table:
        table = Table(title="slowlink bench", title_justify="left")
        for column in ("method", "progress", "worker-steps", "result"):
            table.add_column(column, no_wrap=True)
        for name, row in self.rows.items():
            table.add_row(name, ProgressBar(total=row["total"], completed=row["done"], width=16),
                          f"{row['done']}/{row['total']}", row["result"])  # fmt: skip
        return table


def table_rows(result: BenchResult) -> list[list[str]]:
    ddp = result.outcome("ddp")
    rows = []
    for o in result.outcomes:
        rows.append([
            o.name,
            f"{o.heldout_loss:.4f}",
            f"{(o.heldout_loss / ddp.heldout_loss - 1):+.1%}" if ddp else "",
            decimal(int(o.bytes_per_worker)),
            f"{ddp.bytes_per_worker / o.bytes_per_worker:,.0f}×" if ddp and o.bytes_per_worker else "",
            decimal(o.peak_bytes_per_sync),
            format_duration(o.simulated_seconds),
            f"{o.utilization:.0%}",
        ])  # fmt: skip
    return rows


def markdown_table(result: BenchResult) -> str:
    """The table, its legend and the run's settings, as Markdown."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(result)]
    c = result.config
    lines += ["", f"{c.workers} workers × {c.steps} steps × batch {c.batch_size} (128-byte sequences), "
              f"{c.model} GPT ({result.parameters:,} parameters), H = {c.sync_every}, P = {c.fragments}, "
              f"τ = {c.overlap_steps}, DeMo top-k {c.demo_topk}, seed {c.seed}; link "
              f"{format_bandwidth(result.bandwidth)} and {c.latency * 1000:g} ms per hop, "
              f"{c.step_time:g} s of compute per step, DiLoCo's rounds by {c.exchange}. Held-out loss in nats "
              f"per byte on Python {result.corpus['python']}'s held-out stdlib files.", ""]  # fmt: skip
    lines += [f"- `{o.name}`: {METHODS[o.name].summary}" for o in result.outcomes]
    if result.unfinished:
        lines += ["", f"Not finished (yet): {', '.join(result.unfinished)}."]
    return "\n".join(lines) + "\n"


def smoothed(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def colours(count: int) -> list[tuple[float, float, float]]:
    """One colour per method, all distinct up to 20: tab20's strong ten first (matplotlib's usual cycle),
    then its light ten. The default cycle has ten, and the bench has more methods than that."""
    import matplotlib

    table = matplotlib.colormaps["tab20"].colors
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    return [tuple(table[order[i % 20]]) for i in range(count)]


def plot(result: BenchResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    figure, (by_step, by_time, moved) = plt.subplots(1, 3, figsize=(15, 4.5))
    window = max(1, result.config.steps // 20)
    palette = colours(len(result.outcomes))
    for o, colour in zip(result.outcomes, palette, strict=True):
        steps, seconds, losses = zip(*o.curve, strict=True)
        line = smoothed(list(losses), window)
        by_step.plot(steps, line, label=o.name, color=colour)
        by_time.plot([s / 3600 for s in seconds], line, label=o.name, color=colour)
    names = [o.name for o in result.outcomes]
    moved.barh(names, [o.bytes_per_worker for o in result.outcomes], color=palette)
    moved.set_xscale("log")
    moved.invert_yaxis()
    for axes, label in ((by_step, "step"), (by_time, "simulated hours")):
        axes.set_xlabel(label)
        axes.set_ylabel(f"training loss (nats per byte, mean of {window} steps)")
        axes.grid(alpha=0.3)
    by_time.set_xscale("log")
    by_step.legend(fontsize=8)
    moved.set_xlabel("bytes sent + received per worker (log)")
    moved.grid(alpha=0.3, axis="x")
    c = result.config
    figure.suptitle(f"slowlink bench: {c.model} GPT, {c.workers} workers, {c.steps} steps, H = {c.sync_every}, "
                    f"link {format_bandwidth(result.bandwidth)}")  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def write_results(result: BenchResult, out: Path) -> tuple[Path, Path, Path]:
    """results.json (every number), table.md and bench.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    (out / "table.md").write_text(markdown_table(result))
    return out / "results.json", out / "table.md", plot(result, out / "bench.png")
