"""Errors a user can cause. Each message names the thing, the value, the rule and the fix.

SlowlinkError
├── ConfigError          an option is out of range or conflicts with another (also a ValueError)
├── SchemaMismatch       this node's model differs from the run's (names the first tensor)
├── RunConfigMismatch    this node's algorithm configuration differs from the run's
├── SessionStateError    a Session used outside its `with` block, or twice
├── PayloadError         bytes from the store that fail a check (digest, header, size, encoding)
│   └── ObjectTooLarge   an object over its reader's size limit, refused before it was read
├── TrainingDiverged     this node's parameters hold NaN or values its delta_dtype cannot carry
├── ContributionRefused  this node's Δ is far outside its own history: the model changed outside training
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


class ObjectTooLarge(PayloadError):
    """An object in the store is larger than its reader's `max_bytes`; it was refused before it was read.

    `size` is its length in bytes, or None when it kept coming past the limit whatever it said.
    """

    def __init__(self, key: str, size: int | None, limit: int, where: str = "the mailbox") -> None:
        self.key, self.size, self.limit, self.where = key, size, limit, where
        stated = f"{size} bytes" if size is not None else f"more than {limit} bytes"
        super().__init__(
            f"{key} in {where} is {stated}, over the {limit}-byte limit its reader set, so it was not "
            "read. If it is not the run's, delete it; if it is genuine, read it with a larger "
            "get(..., max_bytes=...)"
        )

    def __reduce__(self) -> tuple:  # the message is built from the fields, so a copy rebuilds from them
        return type(self), (self.key, self.size, self.limit, self.where)


class TrainingDiverged(SlowlinkError):
    """This node's contribution cannot be sent: its parameters hold NaN or infinite values, or values
    beyond what the run's delta_dtype can carry. session.step() raises it; nothing is published."""


class ContributionRefused(SlowlinkError):
    """This node did not publish a contribution whose Δ is many times what its merged contributions were:
    the model was changed outside training (e.g. model.load_state_dict), and merging that would move
    everyone's model. Its steps are kept; session.reset() drops them with the change."""


class MailboxError(SlowlinkError):
    """The store failed."""


class PreconditionFailed(MailboxError):
    """A create-once key already exists, or a compare-and-swap saw another etag."""


class MailboxUnavailable(MailboxError):
    """The store kept failing after retries."""


class MailboxRejected(MailboxError):
    """The store refused for good: no such bucket or directory, no permission, not writable."""
