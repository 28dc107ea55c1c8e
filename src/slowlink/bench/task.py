"""The task every method trains on: the demo's byte-level GPT over the standard library (held-out files for
the final loss), the batch each worker takes at each step, and one learning-rate recipe for all.

Worker w's batch at step s depends on (seed, w, s) alone, so every method sees the same data in the same
order; DDP's global batch at step s is the workers' batches of step s, joined.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..demo.corpus import WINDOW, heldout_windows, load_corpus
from ..demo.model import CLIP, GPT, PEAK_LR, SIZES, GPTConfig, build_model, evaluate, loss_on, make_optimizer

MICRO = GPTConfig(d_model=32, layers=2, heads=2)  # about 20k parameters: the tests' bench, in seconds
WARMUP, FINAL = 0.05, 0.1  # §8: linear warm-up over 5% of the steps, then cosine down to 10%


class Task:
    def __init__(
        self, model: str, *, seed: int, batch_size: int, steps: int, eval_windows: int, lr: float = PEAK_LR
    ) -> None:
        self.size, self.seed, self.batch_size, self.steps, self.lr = model, seed, batch_size, steps, lr
        self.corpus = load_corpus()
        self.heldout = heldout_windows(self.corpus, eval_windows)
        self._models: list[GPT] = []

    def make_model(self) -> GPT:
        """The same initial model every time (its own generator, from the seed)."""
        model = GPT(MICRO, seed=self.seed) if self.size == "micro" else build_model(self.size, seed=self.seed)
        self._models.append(model)
        return model

    @property
    def parameters(self) -> int:
        config = MICRO if self.size == "micro" else SIZES[self.size]
        return sum(p.numel() for p in GPT(config).parameters())

    def batch(self, worker: int, step: int) -> torch.Tensor:
        """(batch_size, 129) int64 windows of the training split, drawn from (seed, worker, step)."""
        train = self.corpus.train
        starts = np.random.default_rng([self.seed, worker, step]).integers(
            0, len(train) - WINDOW + 1, size=self.batch_size
        )
        return torch.from_numpy(train[starts[:, None] + np.arange(WINDOW)[None, :]].astype(np.int64))

    def global_batch(self, workers: int, step: int) -> torch.Tensor:
        return torch.cat([self.batch(worker, step) for worker in range(workers)])

    def loss(self, model: GPT, batch: torch.Tensor) -> torch.Tensor:
        model.train()
        return loss_on(model, batch)

    def lr_factor(self, step: int) -> float:
        """The share of the peak learning rate at a step (from 0): warm-up, then cosine to FINAL."""
        warmup = max(1, round(WARMUP * self.steps))
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, self.steps - warmup)
        return FINAL + (1 - FINAL) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    def optimizer(self, parameters) -> Scheduled:
        """The demo's AdamW recipe (decay on matrices, clip 1.0) at the task's peak lr on this schedule, for a
        model made here."""
        parameters = list(parameters)
        model = next(m for m in self._models if next(m.parameters()) is parameters[0])
        return Scheduled(make_optimizer(model, self.lr), parameters, self.lr_factor)

    def evaluate(self, model: GPT) -> float:
        return evaluate(model, self.heldout)


class Scheduled:
    """An optimizer as sim.run drives it (zero_grad, step): sets the step's learning rate, clips, steps."""

    def __init__(self, inner: torch.optim.Optimizer, parameters: list, factor) -> None:
        self.inner, self.parameters, self.factor, self.steps = inner, parameters, factor, 0
        self.peaks = [group["lr"] for group in inner.param_groups]

    def zero_grad(self) -> None:
        self.inner.zero_grad(set_to_none=True)

    def step(self, clip: float | None = CLIP) -> None:
        for group, peak in zip(self.inner.param_groups, self.peaks, strict=True):
            group["lr"] = peak * self.factor(self.steps)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(self.parameters, clip)
        self.inner.step()
        self.steps += 1
