"""The demo's corpus: the Python standard library's own source, as bytes (research/algorithms.md §8).

Loads it once per process, splits it into training and validation files, and draws seeded training
windows per node and a fixed set of held-out windows. Knows nothing of models or of slowlink.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

SEPARATOR = b"\x1e"  # ASCII record separator: a byte that never occurs in Python source
EXCLUDED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "__pycache__"})
VOCAB_SIZE = 256  # one token per byte
CONTEXT = 128
WINDOW = CONTEXT + 1  # inputs are window[:-1], targets window[1:]


@dataclass(frozen=True)
class Corpus:
    """The joined training and validation bytes, and what identifies them."""

    train: np.ndarray  # uint8, training files joined with SEPARATOR
    val: np.ndarray  # uint8, validation files joined with SEPARATOR
    sha256: str  # of every file, in order, joined with SEPARATOR
    size: int  # bytes in that joined corpus
    files: int
    val_files: int
    python: str  # the stdlib differs across Python versions, so a result names the version


def source_files(root: str | os.PathLike) -> list[str]:
    """Relative paths ('/'-separated) of the `.py` files under root outside the excluded folders, sorted."""
    root = Path(root)
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in EXCLUDED_DIRS]
        relative = Path(folder).relative_to(root)
        found += [(relative / name).as_posix() for name in names if name.endswith(".py")]
    return sorted(found)


def is_validation(relpath: str) -> bool:
    """A file is held out when sha1 of its relative path is 0 mod 20 (about 5% of files)."""
    return int(hashlib.sha1(relpath.encode()).hexdigest(), 16) % 20 == 0


@functools.cache
def load_corpus(root: str | None = None) -> Corpus:
    """The stdlib corpus (about 11 MB on Python 3.11), read once per process and cached."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    paths = source_files(root)
    texts = [(root / path).read_bytes() for path in paths]
    held_out = [is_validation(path) for path in paths]
    whole = SEPARATOR.join(texts)
    train = SEPARATOR.join(text for text, val in zip(texts, held_out, strict=True) if not val)
    val = SEPARATOR.join(text for text, val in zip(texts, held_out, strict=True) if val)
    return Corpus(
        train=np.frombuffer(train, dtype=np.uint8),
        val=np.frombuffer(val, dtype=np.uint8),
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        files=len(paths),
        val_files=sum(held_out),
        python=sys.version.split()[0],
    )


def _windows(data: np.ndarray, starts: np.ndarray) -> torch.Tensor:
    # (B, WINDOW) int64 token ids; fancy indexing copies, so the corpus itself is never handed out.
    index = starts[:, None] + np.arange(WINDOW)[None, :]
    return torch.from_numpy(data[index].astype(np.int64))


class TrainWindows:
    """An endless, seeded stream of training windows for one node.

    i.i.d. (the default): every node draws uniformly from the whole training split, from its own random
    stream seeded by (seed, node). Not i.i.d.: node i of n draws only from the i-th contiguous block of
    the split; files are sorted by path, so different packages go to different nodes.
    """

    def __init__(self, corpus: Corpus, *, node: int = 0, nodes: int = 1, seed: int = 0, iid: bool = True):
        if node < 0 or (not iid and node >= nodes):
            raise ValueError(f"node index {node} is outside 0..{nodes - 1}; pass 0 <= node < nodes")
        span = len(corpus.train) - WINDOW + 1
        self.low, self.high = (0, span) if iid else (node * span // nodes, (node + 1) * span // nodes)
        self.data = corpus.train
        self.rng = np.random.default_rng([seed, node])

    def next_batch(self, batch_size: int) -> torch.Tensor:
        """(batch_size, 129) int64: inputs are [:, :-1], targets [:, 1:]."""
        return _windows(self.data, self.rng.integers(self.low, self.high, size=batch_size))


def heldout_windows(corpus: Corpus, count: int = 64) -> torch.Tensor:
    """(count, 129) int64 windows evenly spaced over the validation split: the same on every call."""
    starts = np.linspace(0, len(corpus.val) - WINDOW, count).astype(np.int64)
    return _windows(corpus.val, starts)
