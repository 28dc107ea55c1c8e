"""Mailboxes: the storage contract and its implementations."""

from .contract import Listing, Mailbox, Object
from .directory import DirMailbox
from .faulty import Faulty
from .memory import MemoryMailbox

__all__ = ["DirMailbox", "Faulty", "Listing", "Mailbox", "MemoryMailbox", "Object", "S3Mailbox"]


def __getattr__(name: str):
    # S3Mailbox needs boto3, an optional extra: import it on first use so `import slowlink` never needs it.
    if name == "S3Mailbox":
        try:
            from .s3 import S3Mailbox
        except ImportError as error:
            from ..errors import ConfigError

            raise ConfigError(
                f"S3Mailbox needs boto3, which is not installed ({error}); install it with: pip install slowlink[s3]"
            ) from error
        return S3Mailbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
