"""slowlink: train one model on machines joined by slow links."""

from .algorithms.diloco import DiLoCo
from .algorithms.merge import WeightedMean
from .algorithms.partition import BalancedBytes, Strided
from .errors import (
    ConfigError,
    MailboxError,
    PayloadError,
    RunConfigMismatch,
    SchemaMismatch,
    SessionStateError,
    SlowlinkError,
)
from .events import Event
from .mailbox import DirMailbox, MemoryMailbox
from .session import Session, SessionStats, align

__all__ = [
    "BalancedBytes",
    "ConfigError",
    "DiLoCo",
    "DirMailbox",
    "Event",
    "MailboxError",
    "MemoryMailbox",
    "PayloadError",
    "RunConfigMismatch",
    "SchemaMismatch",
    "Session",
    "SessionStateError",
    "SessionStats",
    "SlowlinkError",
    "Strided",
    "WeightedMean",
    "align",
]
