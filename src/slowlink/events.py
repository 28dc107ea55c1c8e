"""Events: everything a node does that a person may want to know, as a callback, as logging, and as an
optional JSON-lines file. docs/events.md lists every kind with its fields.

Nothing is silently lost: a contribution rejected, steps replaced or dropped, a sync deferred, a
leader change, each becomes an Event with a reason, is counted in the session's stats, and is logged
on the "slowlink" logger: work that did not reach the model, or a failure, at WARNING; what a run
does in the normal course at INFO; the per-round chatter (each contribution sent, each commit
applied) at DEBUG.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger("slowlink")

# Every kind a run emits, and the level it is logged at. A kind missing here is logged at INFO.
LEVELS: dict[str, int] = {
    # work trained on a node that did not (fully) reach the committed model, or a failure
    "contribution_rejected": logging.WARNING,
    "contribution_late": logging.WARNING,
    "own_contribution_rejected": logging.WARNING,
    "contribution_refused": logging.WARNING,
    "steps_dropped": logging.WARNING,
    "steps_unconfirmed": logging.WARNING,
    "mailbox_error": logging.WARNING,
    "commit_change_refused": logging.WARNING,
    "checkpoint_behind": logging.WARNING,
    "checkpoint_missing": logging.WARNING,
    "lease_ignored": logging.WARNING,
    "upload_failed": logging.WARNING,
    "key_ignored": logging.WARNING,
    "record_replaced": logging.WARNING,
    "plan_reduced": logging.WARNING,
    "stalled": logging.WARNING,
    "self_mixed": logging.WARNING,  # a gossip partner's payload was missing, late, corrupt or of another schema
    # an existing run continued: a script re-run on an old run's folder must not pass for a fresh start
    "joined": logging.WARNING,
    # the normal course of a run
    "run_created": logging.INFO,
    "left": logging.INFO,
    "round_merged": logging.INFO,
    "leader_elected": logging.INFO,
    "leader_lost": logging.INFO,
    "sync_deferred": logging.INFO,
    "sync_skipped": logging.INFO,
    "steps_replaced": logging.INFO,
    "commit_change_skipped": logging.INFO,
    "checkpoint_saved": logging.INFO,
    "checkpoint_loaded": logging.INFO,
    "reset": logging.INFO,
    # every round, on every node
    "contribution_sent": logging.DEBUG,
    "commit_applied": logging.DEBUG,
    "gossip_round": logging.DEBUG,
    "leases_swept": logging.INFO,
}
# Kinds that mean work trained on a node did not (fully) reach the committed model, or a failure.
WARNING_KINDS = {kind for kind, level in LEVELS.items() if level >= logging.WARNING}


@dataclass(frozen=True)
class Event:
    """One thing a node did. kind: what (docs/events.md); node: which node; message: for people;
    data: the figures, by name, for programs (JSON-serializable); time: seconds since the epoch."""

    kind: str
    node: str
    message: str
    data: dict = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def __str__(self) -> str:
        return f"[{self.node}] {self.kind}: {self.message}"

    def to_dict(self) -> dict:
        """The event as one JSON object: time, kind, node, message, data."""
        return {"time": self.time, "kind": self.kind, "node": self.node, "message": self.message,
                "data": _jsonable(self.data)}  # fmt: skip


def level_of(kind: str) -> int:
    """The logging level events of `kind` are logged at."""
    return LEVELS.get(kind, logging.INFO)


def log_event(event: Event) -> None:
    """Log `event` on the "slowlink" logger; the Event itself rides along as `record.event`."""
    level = level_of(event.kind)
    if logger.isEnabledFor(level):
        logger.log(level, "%s", event, extra={"event": event})


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(item) for item in (sorted(value) if isinstance(value, set | frozenset) else value)]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a missing figure reads as null
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


class JsonLines:
    """Appends each event to a JSON-lines file, one object a line (Event.to_dict); pass it as
    `on_event`, or give Session `events_file=path`. `scalars()` adds a line of figures of the user's own
    (a training loss, say) that `slowlink report` plots. Several processes may append to one file: each
    line is written by a single append."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        self.write(event.to_dict())

    def scalars(self, *, node: str, step: int, **values: float) -> None:
        """Record figures at a step, e.g. `log.scalars(node=session.node_id, step=step, loss=loss)`."""
        self.write({"time": time.time(), "kind": "scalars", "node": node, "message": "",
                    "data": _jsonable({"step": step, **values})})  # fmt: skip

    def write(self, record: dict) -> None:
        """Append one JSON object as a line; a line left unfinished by a killed writer is ended first."""
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            descriptor = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(descriptor).st_size
                if size and os.pread(descriptor, 1, size - 1) != b"\n":
                    line = b"\n" + line  # the last writer died mid-line: start a line of our own
                os.write(descriptor, line)
            finally:
                os.close(descriptor)


def read_events(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON-lines events file; a line cut short (a process killed mid-write) is skipped."""
    found = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("kind"), str):
            found.append(record)
    return found
