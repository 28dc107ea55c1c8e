"""`slowlink report`: one self-contained HTML page about a run, finished or running: its configuration,
rounds and their contributors over time, bytes per node, stalls and leader changes, rejections, and
loss where the nodes logged it in events files. Plots are inline PNGs; the page loads nothing.

The figures come from the store (status.py: summary.json, the newest commits, the leases) and, where
the store keeps no history (no summary.json yet), from the events files' round_merged lines.
"""

from __future__ import annotations

import base64
import html
import json
import time
from collections import defaultdict
from collections.abc import Iterable

from rich.filesize import decimal

from .plots import plot_bytes, plot_loss, plot_rounds
from .status import RunStatus, find_stalls

LOSS_SUFFIX = "loss"  # scalars named loss, heldout_loss, train_loss, ... are plotted

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d1d1f; background: #fff; }
header { height: 96px; box-sizing: border-box; padding: 16px 24px; background: #f3f4f7;
         border-bottom: 1px solid #d8dbe2; overflow: hidden; }
header h1 { font-size: 20px; margin: 0 0 6px; }
main { padding: 16px 24px; width: 960px; }
figure { margin: 0 0 24px; }
figure img { display: block; width: 960px; }
figcaption { color: #555; font-size: 12px; }
table { border-collapse: collapse; margin: 6px 0 20px; font-size: 13px; }
th, td { border: 1px solid #d8dbe2; padding: 3px 8px; text-align: right; vertical-align: top; }
th:first-child, td:first-child, td.text { text-align: left; }
td:first-child { white-space: nowrap; }
th { background: #f3f4f7; }
h2 { font-size: 16px; margin: 20px 0 6px; }
.warning { color: #a3311a; }
"""


def _escape(value: object) -> str:
    return html.escape("-" if value is None else str(value))


def _table(headers: list[str], rows: Iterable[list[object]], *, text_columns: Iterable[int] = ()) -> str:
    text = set(text_columns)
    head = "".join(f"<th>{_escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=text' if i in text else ''}>{_escape(v)}</td>" for i, v in enumerate(row)) + "</tr>"
        for row in rows
    )  # fmt: skip
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(name: str, png: bytes, caption: str) -> str:
    data = base64.b64encode(png).decode()
    return (f'<figure id="plot-{name}"><img alt="{_escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_escape(caption)}</figcaption></figure>")  # fmt: skip


def _megabytes(value: int | None) -> str:
    return "-" if value is None else decimal(value)


def timeline_from_events(events: list[dict]) -> list[list]:
    """[time, fragment, round, contributors, rejected, merger] of each commit a merger reported."""
    seen = {}
    for event in events:
        data = event.get("data") or {}
        if event.get("kind") == "round_merged" and isinstance(data.get("round"), int):
            seen.setdefault((data.get("fragment"), data["round"]), [
                float(event["time"]), data.get("fragment"), data["round"], list(data.get("contributors") or []),
                len(data.get("rejected") or {}), event.get("node")])  # fmt: skip
    return sorted(seen.values())


def leader_changes_in(timeline: list[list]) -> list[dict]:
    """Each commit whose merger differs from the previous commit's, in time order."""
    changes = []
    for before, after in zip(timeline, timeline[1:], strict=False):
        if before[5] != after[5]:
            changes.append(
                {"time": after[0], "fragment": after[1], "round": after[2], "from": before[5], "to": after[5]}
            )
    return changes


def loss_series(events: list[dict]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(node, name) -> [(step, value)] of every figure named *loss in the events' `scalars` lines."""
    series: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for event in events:
        data = event.get("data") or {}
        if event.get("kind") != "scalars" or not isinstance(data.get("step"), int):
            continue
        for name, value in data.items():
            if name.endswith(LOSS_SUFFIX) and isinstance(value, int | float):
                series[str(event.get("node")), name].append((data["step"], float(value)))
    return dict(series)


def bytes_per_node(status: RunStatus, events: list[dict]) -> tuple[dict[str, int], str]:
    """Bytes of each node's contributions: measured in the store (summary.json), else as the nodes
    reported them in their events files."""
    if status.summary:
        return {
            n.node: n.payload_bytes for n in status.nodes if n.payload_bytes
        }, "contribution payloads, from summary.json"
    sent: dict[str, int] = defaultdict(int)
    for event in events:
        if event.get("kind") == "contribution_sent" and isinstance(
            (event.get("data") or {}).get("bytes"), int
        ):
            sent[str(event.get("node"))] += event["data"]["bytes"]
    return dict(sent), "contribution payloads, from the events files"


def build_report(status: RunStatus, events: list[dict], *, title: str | None = None) -> str:
    """The page, as one string of HTML."""
    timeline = status.timeline or timeline_from_events(events)
    source = "summary.json" if status.timeline else "the events files" if timeline else None
    stalls = status.stalls if status.timeline else find_stalls([entry[0] for entry in timeline])
    changes = status.leader_changes if status.timeline or not timeline else leader_changes_in(timeline)
    parts = ["<h2>rounds</h2>"]
    if timeline:
        parts.append(_figure("rounds", plot_rounds(timeline, stalls, changes),
                             f"{len(timeline)} commits from {source}; shaded: stalls; dashed: leader changes"))  # fmt: skip
    else:
        parts.append("<p>No history of rounds: the store keeps no summary.json yet and no events file was given "
                     "(slowlink report --events FILE).</p>")  # fmt: skip
    per_node, what = bytes_per_node(status, events)
    parts.append("<h2>bytes</h2>")
    if per_node:
        parts.append(_figure("bytes", plot_bytes(per_node, what=what), f"bytes per node: {what}"))
    moved = status.bytes
    parts.append(f"<p>contributions: {_megabytes(moved['contributions'])}{' (estimated)' if moved['estimated'] else ''}; "
                 f"commits written: {_megabytes(moved['commits'])}</p>")  # fmt: skip
    series = loss_series(events)
    parts.append("<h2>loss</h2>")
    parts.append(_figure("loss", plot_loss(series), "loss from the events files' scalars lines") if series
                 else "<p>No loss logged: the nodes write it with sl.events.JsonLines(path).scalars(...).</p>")  # fmt: skip
    parts += [_nodes_section(status), _fragments_section(status), _incidents_section(status, stalls, changes)]
    parts.append("<h2>configuration</h2><pre>" + _escape(json.dumps(status.config, indent=2)) + "</pre>")
    heading = title or f"slowlink run {status.run_id[:12]}"
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    running = sum(1 for n in status.nodes if n.state != "departed")
    return (
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{_escape(heading)}</title>"
        f"<style>{STYLE}</style></head><body><header><h1>{_escape(heading)}</h1>"
        f"<div>{_escape(status.mailbox)} · {status.parameters:,} parameters · {len(status.fragments)} fragment(s) · "
        f"rounds {_escape(status.head)} · {running} node(s) with a lease, {len(status.nodes) - running} departed · "
        f"generated {generated}</div></header><main>{''.join(parts)}</main></body></html>\n"
    )  # fmt: skip


def _nodes_section(status: RunStatus) -> str:
    rows = [[n.node + (" (leader)" if n.is_leader else ""), n.state, n.step, n.samples, n.contributions,
             n.steps_merged, n.samples_merged, _megabytes(n.payload_bytes), n.rounds_merged, n.rejected,
             n.last_rejection] for n in status.nodes]  # fmt: skip
    headers = ["node", "state", "step", "samples", "contributions", "steps merged", "samples merged",
               "payload bytes", "rounds merged", "rejected", "last rejection"]  # fmt: skip
    return "<h2>nodes</h2>" + _table(headers, rows, text_columns=(1, 10))


def _fragments_section(status: RunStatus) -> str:
    rows = []
    for view in status.fragments:
        for commit in view.recent:
            rejected = "; ".join(f"{r['node']}: {r['reason']}" for r in commit["rejected"])
            rows.append(
                [
                    view.fragment,
                    commit["round"],
                    commit["merger"],
                    ", ".join(commit["contributors"]),
                    rejected or None,
                ]
            )
    headers = ["fragment", "round", "merger", "contributors", "rejected"]
    return "<h2>newest commits</h2>" + _table(headers, rows, text_columns=(2, 3, 4))


def _incidents_section(status: RunStatus, stalls: list[dict], changes: list[dict]) -> str:
    start = status.timeline[0][0] if status.timeline else None
    stall_rows = [[f"{s['seconds']:.1f} s", "now" if s["ongoing"] else "",
                   f"{s['start'] - start:.1f} s" if start is not None else time.strftime("%H:%M:%S", time.localtime(s["start"]))]
                  for s in stalls]  # fmt: skip
    change_rows = [[c.get("fragment"), c.get("round"), c.get("from"), c.get("to")] for c in changes]
    return (
        f"<h2>stalls: {len(stalls)}</h2>"
        + (_table(["length", "ongoing", "began"], stall_rows) if stalls else "<p>none</p>")
        + f"<h2>leader changes: {len(changes)} (leader.json term {status.leader_term})</h2>"
        + (
            _table(["fragment", "round", "from", "to"], change_rows, text_columns=(2, 3))
            if changes
            else "<p>none</p>"
        )
    )
