"""Mailboxes: the storage contract and its implementations."""

from .contract import Listing, Mailbox, Object
from .directory import DirMailbox
from .memory import MemoryMailbox

__all__ = ["DirMailbox", "Listing", "Mailbox", "MemoryMailbox", "Object"]
