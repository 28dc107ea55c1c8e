"""slowlink: train one model on machines joined by slow links."""

from . import checkpoint, metrics
from .algorithms.diloco import DiLoCo
from .algorithms.gossip import GossipDiLoCo
from .algorithms.merge import WeightedMean
from .algorithms.noloco import NoLoCo
from .algorithms.partition import BalancedBytes, Strided
from .algorithms.rda import RDA
from .algorithms.robust import NormClippedMean, TrimmedMean
from .align import align
from .errors import (
    ConfigError,
    ContributionRefused,
    MailboxError,
    PayloadError,
    RunConfigMismatch,
    SchemaMismatch,
    SessionStateError,
    SlowlinkError,
    TrainingDiverged,
)
from .events import Event
from .mailbox import DirMailbox, MemoryMailbox
from .session import Session, SessionStats
from .wire.topk import TopK


def __getattr__(name: str):
    # DeMo is a torch optimizer (the torch extra): imported on first use, like S3Mailbox.
    if name == "DeMo":
        from .optim import DeMo

        return DeMo
    # sl.collective (runs over torch.distributed process groups) needs torch: imported on first use too.
    if name == "collective":
        import importlib

        return importlib.import_module(".collective", __name__)
    # S3Mailbox needs boto3 (the s3 extra): imported on first use, so `import slowlink` works without it.
    if name == "S3Mailbox":
        from .mailbox import S3Mailbox

        return S3Mailbox
    raise AttributeError(f"module 'slowlink' has no attribute {name!r}")


__all__ = [
    "BalancedBytes",
    "ConfigError",
    "ContributionRefused",
    "DeMo",
    "DiLoCo",
    "DirMailbox",
    "Event",
    "GossipDiLoCo",
    "MailboxError",
    "MemoryMailbox",
    "NoLoCo",
    "NormClippedMean",
    "RDA",
    "PayloadError",
    "S3Mailbox",
    "RunConfigMismatch",
    "SchemaMismatch",
    "Session",
    "SessionStateError",
    "SessionStats",
    "SlowlinkError",
    "Strided",
    "TopK",
    "TrainingDiverged",
    "TrimmedMean",
    "WeightedMean",
    "align",
    "checkpoint",
    "collective",
    "metrics",
]
