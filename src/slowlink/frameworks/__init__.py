"""Framework adapters: a tensor schema, host snapshots and in-place updates of a user's model."""

from .base import Adapter, adapter_for, compare_frozen, compare_schemas, frozen_of, local_of, schema_digest

__all__ = [
    "Adapter",
    "adapter_for",
    "compare_frozen",
    "compare_schemas",
    "frozen_of",
    "local_of",
    "schema_digest",
]
