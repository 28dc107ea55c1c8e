"""Errors a user can cause. Each message names the thing, the value, the rule and the fix.

SlowlinkError
├── ConfigError          an option is out of range or conflicts with another (also a ValueError)
├── SchemaMismatch       this node's model differs from the run's (names the first tensor)
├── RunConfigMismatch    this node's algorithm configuration differs from the run's
├── SessionStateError    a Session used outside its `with` block, or twice
├── PayloadError         bytes from the store that fail a check (digest, header, size, encoding)
├── TrainingDiverged     this node's parameters hold NaN or values its delta_dtype cannot carry
└── MailboxError         the store failed
    ├── PreconditionFailed   a create-once key exists, or a compare-and-swap lost
    ├── MailboxUnavailable   the store kept failing after retries (throttling, 5xx, timeouts)
    └── MailboxRejected      the store refused for good (no such bucket, no permission, not writable)
"""


class SlowlinkError(Exception):
    """Base of every error slowlink raises on purpose."""


class ConfigError(SlowlinkError, ValueError):
    """An option is out of range, or two options conflict."""


class SchemaMismatch(SlowlinkError):
    """This node's parameters differ in names, shapes or dtypes from the run's."""


class RunConfigMismatch(SlowlinkError):
    """This node's algorithm configuration differs from the one recorded in the run."""


class SessionStateError(SlowlinkError, RuntimeError):
    """A Session was used outside its `with` block, or entered twice."""


class PayloadError(SlowlinkError):
    """Bytes read from the store failed a check; they never touch a model."""


class TrainingDiverged(SlowlinkError):
    """This node's contribution cannot be sent: its parameters hold NaN or infinite values, or values
    beyond what the run's delta_dtype can carry. session.step() raises it; nothing is published."""


class MailboxError(SlowlinkError):
    """The store failed."""


class PreconditionFailed(MailboxError):
    """A create-once key already exists, or a compare-and-swap saw another etag."""


class MailboxUnavailable(MailboxError):
    """The store kept failing after retries."""


class MailboxRejected(MailboxError):
    """The store refused for good: no such bucket or directory, no permission, not writable."""
