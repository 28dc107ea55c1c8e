"""Events: everything a node does that a person may want to know, as a callback and as logging.

Nothing is silently lost: a contribution rejected, steps replaced or dropped, a sync deferred, a
leader change, each becomes an Event with a reason, is counted in the session's stats, and is logged
on the "slowlink" logger.
"""

import logging
import time
from dataclasses import dataclass, field

logger = logging.getLogger("slowlink")

# Kinds that mean work trained on a node did not (fully) reach the committed model, or waited.
WARNING_KINDS = {
    "contribution_rejected",
    "steps_dropped",
    "steps_unconfirmed",
    "contribution_late",
    "upload_failed",
}


@dataclass(frozen=True)
class Event:
    kind: str
    node: str
    message: str
    data: dict = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def __str__(self) -> str:
        return f"[{self.node}] {self.kind}: {self.message}"


def log_event(event: Event) -> None:
    logger.log(logging.WARNING if event.kind in WARNING_KINDS else logging.INFO, "%s", event)
