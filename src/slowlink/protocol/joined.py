"""What a node joining an existing run can cheaply tell of it: how old it is, how far it got, who trained in
it. A script re-run on the folder of an earlier run continues that run; the `joined` event says so, with
these figures, so that nobody mistakes it for a fresh start (docs/events.md)."""

from ..errors import ConfigError, MailboxError, PayloadError
from ..events import Event
from ..mailbox.contract import Mailbox
from .run import Run
from .summary import read_summary


def joined_event(mailbox: Mailbox, run: Run, node_id: str, versions: list[int], live: set[str]) -> Event:
    """The `joined` event of node `node_id`. Its data: versions (each fragment's newest commit), age_seconds
    (since the run's first commit) and idle_seconds (since its newest), steps (merged into fragment 0's
    commits), nodes (every node a commit merged) and live_nodes (the other nodes holding a lease now). From
    summary.json (one GET, none before the first commit); figures it cannot give are None."""
    summary = None  # none before the first commit: then joining reads nothing for it
    try:
        if any(versions):
            summary, now = read_summary(mailbox, len(run.plan))[0], mailbox.clock()
    except (MailboxError, PayloadError):
        summary = None  # a report only: joining never waits on it
    age = idle = steps = None
    nodes: list[str] = []
    if summary is not None:
        if summary["timeline"]:
            age = max(0.0, now - summary["timeline"][0][0])
        if summary["updated"] is not None:
            idle = max(0.0, now - summary["updated"])
        steps = summary["fragments"][0]["steps"]
        nodes = sorted(summary["nodes"])
    if not any(versions):
        message = f"joined run {run.run_id[:8]}, which has no commit yet"
    else:
        told = [f"at rounds {versions}"]
        if age is not None and idle is not None:
            told.append(f"first commit {_ago(age)} ago, newest {_ago(idle)} ago")
        if steps is not None:
            told.append(f"{steps} steps merged from {len(nodes)} node(s) {', '.join(nodes[:5])}")
        told.append(f"{len(live)} other node(s) live now")
        message = (f"joined run {run.run_id[:8]} and continues it from its newest commit ({'; '.join(told)}); "
                   "to start afresh, give the run a new folder or prefix (Session(..., resume=False) refuses "
                   "to continue a run)")  # fmt: skip
    return Event("joined", node_id, message, {"versions": versions, "age_seconds": age, "idle_seconds": idle,
                                              "steps": steps, "nodes": nodes, "live_nodes": sorted(live)})  # fmt: skip


def refuse_resuming(mailbox: object, run_id: str, versions: list[int]) -> None:
    """resume=False: a run that has committed rounds is not joined (one without any commit yet is: another
    node of the same start has just created it)."""
    if any(versions):
        raise ConfigError(
            f"resume=False, but {mailbox!r} holds run {run_id[:8]}, committed up to rounds {versions}: give "
            "this run a new folder or prefix, or pass resume=True to continue that run"
        )


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"
