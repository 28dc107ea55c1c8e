"""Optimizers that are whole methods: they exchange with the other nodes inside step() (DeMo)."""

from .demo import DeMo

__all__ = ["DeMo"]
