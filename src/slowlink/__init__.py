"""slowlink: train one model on machines joined by slow links."""

from .errors import (
    ConfigError,
    MailboxError,
    PayloadError,
    RunConfigMismatch,
    SchemaMismatch,
    SessionStateError,
    SlowlinkError,
)
from .mailbox import DirMailbox, MemoryMailbox

__all__ = [
    "ConfigError",
    "DirMailbox",
    "MailboxError",
    "MemoryMailbox",
    "PayloadError",
    "RunConfigMismatch",
    "SchemaMismatch",
    "SessionStateError",
    "SlowlinkError",
]
