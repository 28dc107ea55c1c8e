"""slowlink bench: the methods side by side on the demo's byte-level language model, each in a simulator (DDP:
one model on the joined batch) with the same seed, data order and samples; a table, plots and a live display. The methods are entries of one registry (registry.py); docs/bench.md says how to read it.
"""

from .config import PRESETS, BenchConfig
from .registry import METHODS, Entry
from .run import BenchResult, run_bench

__all__ = ["METHODS", "PRESETS", "BenchConfig", "BenchResult", "Entry", "run_bench"]
