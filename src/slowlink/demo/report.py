"""What a person sees of the demo: a live table per node while it runs, then a summary table, a table
of each node's counters, and a PNG of held-out loss against samples and against wall time.

Rendering only; the numbers come from run.py's DemoResult.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console, Group
from rich.filesize import decimal
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from .run import DemoResult

# Counters of work trained on a node that did not reach the model in its own round ("nothing lost" when
# the first three stay at zero; a late contribution is carried into the next round, not lost). A counter
# this version of Session does not keep is left out of the tables.
LOSS_COUNTERS = ("steps_dropped", "rounds_skipped", "contributions_rejected", "contributions_late")
NODE_COUNTERS = ("step", "commits_applied", "rounds_merged", "bytes_sent", "bytes_received", "requests")


class LiveView:
    """One live table per phase: per node its step, smoothed training loss, rounds and bytes."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None
        self.title, self.steps, self.rows = "", 0, {}

    def begin(self, title: str, nodes: list[str], steps: int) -> None:
        self.end()
        self.title, self.steps = title, steps
        self.rows = {node: {"step": 0, "loss": None, "stats": {}, "event": ""} for node in nodes}
        self.live = Live(get_renderable=self._render, console=self.console, refresh_per_second=4)
        self.live.start()

    def update(self, message: dict) -> None:
        row = self.rows[message["node"]]
        if message["kind"] == "progress":
            row["step"], row["stats"] = message["step"], message["stats"]
            # The batch loss is noisy; an exponential average shows the trend.
            row["loss"] = (
                message["loss"] if row["loss"] is None else 0.9 * row["loss"] + 0.1 * message["loss"]
            )
        elif message["kind"] == "eval":
            row["heldout"] = message["loss"]
        elif message["kind"] == "event":
            row["event"] = f"{message['event']}: {message['message']}"
        elif message["kind"] == "done":
            row["stats"] = message["stats"] or row["stats"]
            row["event"] = "done"

    def end(self) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
            self.live = None
            if not self.console.is_terminal or self.console.is_dumb_terminal:
                # On a terminal rich ends the live view's last line itself; in a file or a pipe it leaves
                # the line open, and the next table would start on it ("node-1: doneone process alone").
                self.console.line()

    def _render(self) -> Group:
        table = Table(title=self.title, title_justify="left")
        for column in ("node", "progress", "step", "loss", "held-out", "rounds", "sent", "received"):
            table.add_column(
                column, no_wrap=True, justify="left" if column in ("node", "progress") else "right"
            )
        for node, row in self.rows.items():
            stats = row["stats"]
            table.add_row(
                node,
                ProgressBar(total=self.steps, completed=row["step"], width=12),
                f"{row['step']}/{self.steps}",
                "" if row["loss"] is None else f"{row['loss']:.3f}",
                f"{row['heldout']:.3f}" if "heldout" in row else "",
                str(stats.get("commits_applied", "-")),
                decimal(stats["bytes_sent"]) if "bytes_sent" in stats else "-",
                decimal(stats["bytes_received"]) if "bytes_received" in stats else "-",
            )
        # Text, not markup: an event's message may hold brackets.
        events = [
            Text(f"{node}: {row['event']}", style="dim") for node, row in self.rows.items() if row["event"]
        ]
        return Group(table, *events)


def _counters(result: DemoResult, names: tuple[str, ...]) -> list[str]:
    return [name for name in names if any(name in stats for stats in result.distributed.stats.values())]


def _total(result: DemoResult, counter: str) -> int:
    return sum(stats.get(counter, 0) for stats in result.distributed.stats.values())


def _data_parallel_bytes(result: DemoResult) -> int:
    # What a gradient exchange every step would send: each node's fp32 gradient, once per step (a ring
    # all-reduce sends 2(M-1)/M times that; a parameter server once).
    return result.config.workers * result.config.steps * result.parameters * 4


def summary_table(result: DemoResult) -> Table:
    """Metrics as rows, the two configurations as columns: narrow enough for any terminal."""
    config, dist, alone = result.config, result.distributed, result.alone
    table = Table(title="slowlink demo: results", title_justify="left")
    table.add_column("")
    table.add_column(
        f"{config.workers} nodes, DiLoCo H={config.sync_every}, P={config.fragments}", justify="right"
    )
    table.add_column("1 process alone", justify="right")
    rows = [
        ("held-out loss, final model", f"{dist.final_loss:.4f}", f"{alone.final_loss:.4f}"),
        (
            f"held-out loss at {dist.wall_s:.0f} s",
            f"{dist.final_loss:.4f}",
            f"{result.alone_loss_at_equal_wall:.4f}",
        ),
        ("samples", f"{dist.samples:,}", f"{alone.samples:,}"),
        ("wall time", f"{dist.wall_s:.1f} s", f"{alone.wall_s:.1f} s"),
        ("CPU busy per learner", f"{dist.core_share:.0%}", f"{alone.core_share:.0%}"),
        ("bytes sent", decimal(_total(result, "bytes_sent")), "0"),
        ("bytes sent by data-parallel training", decimal(_data_parallel_bytes(result)), "0"),
        ("bytes received", decimal(_total(result, "bytes_received")), "0"),
        ("rounds committed", " / ".join(str(s.get("commits_applied", 0)) for s in dist.stats.values()), "-"),
    ]
    rows += [
        (name.replace("_", " "), str(_total(result, name)), "-") for name in _counters(result, LOSS_COUNTERS)
    ]
    for row in rows:
        table.add_row(*row)
    table.caption = (
        "losses in nats per byte on held-out stdlib files; the distributed model is the committed one"
    )
    return table


def node_table(result: DemoResult) -> Table:
    """Each node's final Session counters, one column per node."""
    table = Table(title="per node", title_justify="left")
    table.add_column("")
    for node, stats in result.distributed.stats.items():
        table.add_column(node + (" (leader)" if stats.get("is_leader") else ""), justify="right")
    for name in _counters(result, NODE_COUNTERS + LOSS_COUNTERS):
        cells = [
            decimal(stats[name]) if name.startswith("bytes") else str(stats.get(name, "-"))
            for stats in result.distributed.stats.values()
        ]
        table.add_row(name.replace("_", " "), *cells)
    return table


def print_report(console: Console, result: DemoResult, png: Path) -> None:
    dist = result.distributed
    gain = result.alone_loss_at_equal_wall - dist.final_loss
    verdict = (
        f"In the same {dist.wall_s:.0f} s, {result.config.workers} nodes reached a held-out loss "
        f"{abs(gain):.3f} nats {'lower' if gain > 0 else 'higher'} than one process alone."
    )
    corpus = result.corpus
    if dist.core_share < 0.85 and dist.core_share < result.alone.core_share - 0.1:
        verdict += (
            f"\n[yellow]Each learner was busy only {dist.core_share:.0%} of the time while "
            f"{result.config.workers} ran together ({result.alone.core_share:.0%} alone): other programs were "
            f"using this machine's {os.cpu_count()} cores, or the learners waited on the mailbox; either "
            "favours the process alone at equal wall time.[/yellow]"
        )
    console.print(
        Group(
            summary_table(result),
            node_table(result),
            verdict,
            f"model: {result.config.model}, {result.parameters:,} parameters; corpus: Python {corpus['python']} "
            f"stdlib, {corpus['bytes']:,} bytes, sha256 {corpus['sha256'][:16]}…",
            f"loss curves: {png}",
            *_mailbox_lines(result),
        )
    )


def _mailbox_lines(result: DemoResult) -> list[Text]:
    """Where the run stays for `slowlink status` and `slowlink report`, when --mailbox named a folder."""
    config = result.config
    if config.mailbox is None:
        return [Text("the run's mailbox was temporary; pass --mailbox PATH to keep it for slowlink status")]
    events = Path(config.out) / "events-*.jsonl"
    return [
        Text(f"the run's mailbox: {config.mailbox}"),
        Text(f"  slowlink status {config.mailbox}"),
        Text(
            f"  slowlink report {config.mailbox} --events {events} --out {Path(config.out) / 'report.html'}"
        ),
    ]


def write_results(result: DemoResult, out: Path) -> Path:
    """summary.json (every number of the run) and loss.png; returns the PNG's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return plot_curves(result, out / "loss.png")


def plot_curves(result: DemoResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    dist, alone = result.distributed, result.alone
    figure, (by_samples, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    label = f"{result.config.workers} nodes (mean of local models)"
    for axes, x in ((by_samples, "samples"), (by_time, "wall")):
        axes.plot(getattr(dist.curve, x), dist.curve.loss, "o-", ms=3, label=label)
        axes.plot(getattr(alone.curve, x), alone.curve.loss, "s-", ms=3, label="1 process alone")
        final_x = dist.samples if x == "samples" else dist.wall_s
        axes.plot([final_x], [dist.final_loss], "*", ms=14, color="C0", label="committed model")
        axes.grid(alpha=0.3)
    by_time.axvline(dist.wall_s, color="gray", ls="--", lw=1)
    by_time.plot(
        [dist.wall_s], [result.alone_loss_at_equal_wall], "x", ms=10, color="C1", label="alone, same time"
    )
    # The untrained model's loss (about 5.5) would squash the part of the curves worth reading.
    later = [loss for curve in (dist.curve, alone.curve) for loss in curve.loss[1:]]
    if later:
        low, high = min(later + [dist.final_loss]), max(later)
        by_samples.set_ylim(low - 0.05 * (high - low), min(high, low + 1.5))
    by_samples.set_xlabel("samples (sequences of 128 bytes, all nodes)")
    by_time.set_xlabel("wall time (s)")
    by_samples.set_ylabel("held-out loss (nats per byte)")
    by_time.legend()
    figure.suptitle(
        f"slowlink demo: {result.config.model} GPT, DiLoCo H={result.config.sync_every}, "
        f"P={result.config.fragments}, batch {result.config.batch_size}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
