"""`slowlink status` drawn for people: the run's configuration, a table of nodes, a table of fragments,
then bytes, stalls and leader changes. Rendering only; the figures come from status.py's RunStatus.
"""

from __future__ import annotations

from rich.console import Group
from rich.filesize import decimal
from rich.table import Table
from rich.text import Text

from .status import RunStatus

CONFIG_SHOWN = ("sync_every", "fragments", "quorum_size", "overlap_steps", "mixing", "outer_lr",
                "outer_momentum", "delta_dtype", "commit_dtype", "merge", "partition")  # fmt: skip


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 90:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min" if value < 5400 else f"{value / 3600:.1f} h"


def _number(value: int | float | None, *, bytes_: bool = False) -> str:
    if value is None:
        return "-"
    return decimal(int(value)) if bytes_ else f"{value:,}"


def _config(status: RunStatus) -> str:
    shown = []
    for name in CONFIG_SHOWN:
        value = status.config.get(name)
        if value is not None:
            shown.append(f"{name}={value['name'] if isinstance(value, dict) and 'name' in value else value}")
    return ", ".join(shown)


def header(status: RunStatus) -> Text:
    lines = [
        f"run {status.run_id[:12]} in {status.mailbox}",
        f"  {_config(status)}",
        f"  {status.parameters:,} parameters in {len(status.fragments)} fragment(s)"
        + (", signed with a run key" if status.signed else ""),
        f"  leader: {status.leader or 'none'} (term {status.leader_term}); newest commit "
        + (
            f"{_seconds(status.last_commit_age)} ago"
            if status.last_commit_age is not None
            else "time unknown"
        ),
    ]
    if not status.summary:
        lines.append("  no summary.json yet: totals and departed nodes come from the newest commits only")
    return Text("\n".join(lines))


def nodes_table(status: RunStatus) -> Table:
    table = Table(title="nodes", title_justify="left")
    columns = ["node", "state", "lease age", "step", "samples", "steps/s", "lag", "contributions",
               "steps merged", "samples merged", "payload bytes", "merged", "rejected"]  # fmt: skip
    for column in columns:
        table.add_column(column, no_wrap=True, justify="left" if column in ("node", "state") else "right")
    for node in status.nodes:
        if node.lease_age is not None:
            age = _seconds(node.lease_age)
        elif node.state == "departed":
            age = "-"
        else:
            age = f"> {_seconds(node.watched)}"
        table.add_row(
            node.node + (" (leader)" if node.is_leader else ""),
            node.state,
            age,
            _number(node.step),
            _number(node.samples),
            "-" if node.steps_per_second is None else f"{node.steps_per_second:.2f}",
            _number(node.lag),
            _number(node.contributions),
            _number(node.steps_merged),
            _number(node.samples_merged),
            _number(node.payload_bytes, bytes_=True),
            str(node.rounds_merged),
            str(node.rejected),
        )
    return table


def fragments_table(status: RunStatus) -> Table:
    table = Table(title="fragments: newest round", title_justify="left")
    for column in (
        "fragment",
        "round",
        "merger",
        "contributors",
        "rejected",
        "contributions",
        "payload bytes",
    ):
        justify = "right" if column in ("fragment", "round", "contributions", "payload bytes") else "left"
        table.add_column(column, justify=justify, no_wrap=column != "rejected")
    for view in status.fragments:
        contributors = ", ".join(f"{c['node']} ({c['samples']})" for c in view.contributors)
        rejected = "; ".join(f"{r['node']}: {r['reason']}" for r in view.rejected)
        table.add_row(
            str(view.fragment),
            str(view.round),
            view.merger or "-",
            contributors or "-",
            rejected or "-",
            _number(view.contributions),
            _number(view.payload_bytes, bytes_=True),
        )
    return table


def footer(status: RunStatus) -> Text:
    moved = status.bytes
    lines = [
        f"bytes moved: {decimal(moved['contributions'])} of contributions"
        + (" (estimated)" if moved["estimated"] else "")
        + (f", {decimal(moved['commits'])} of commits written" if moved["commits"] else "")
    ]
    if status.commits_unsummarized:
        lines.append(f"{status.commits_unsummarized} commit(s) are missing from summary.json's totals")
    rejections = [(n.node, n.rejected, n.last_rejection) for n in status.nodes if n.rejected]
    for name, count, reason in rejections:
        lines.append(f"rejected from {name}: {count}, last because {reason}")
    if status.stalls:
        for stall in status.stalls:
            what = "no commit for" if stall["ongoing"] else "a stall of"
            lines.append(f"{what} {_seconds(stall['seconds'])}" + (" (now)" if stall["ongoing"] else ""))
    else:
        lines.append("stalls: none seen")
    changes = status.leader_changes
    lines.append(f"leader changes: {len(changes)}" + (":" if changes else ""))
    for change in changes[-5:]:
        lines.append(
            f"  fragment {change['fragment']} round {change['round']}: {change['from']} → {change['to']}"
        )
    lines.append(f"({status.requests} requests to the store)")
    return Text("\n".join(lines))


def render_status(status: RunStatus) -> Group:
    return Group(header(status), nodes_table(status), fragments_table(status), footer(status))
