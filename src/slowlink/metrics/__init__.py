"""Figures about a run that no single layer owns: how far the nodes' models are apart (consensus.py)."""

from .consensus import Consensus, consensus, js_consensus, l2_consensus

__all__ = ["Consensus", "consensus", "js_consensus", "l2_consensus"]
