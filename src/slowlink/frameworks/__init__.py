"""Framework adapters: a parameter schema, host snapshots and in-place updates of a user's model."""

from .base import Adapter, adapter_for, compare_schemas, schema_digest

__all__ = ["Adapter", "adapter_for", "compare_schemas", "schema_digest"]
