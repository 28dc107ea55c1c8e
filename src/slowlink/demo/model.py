"""The demo's model: a small byte-level pre-LN GPT, its training step, evaluation and AdamW recipe.

Sizes follow research/algorithms.md §8 ("tiny" for tests, "small" for the demo). Blocks are named
`blocks.<i>.` so that slowlink's Strided partition deals them to fragments; the rest is left to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .corpus import CONTEXT, VOCAB_SIZE


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    d_model: int = 128
    layers: int = 4
    heads: int = 4
    context: int = CONTEXT
    vocab: int = VOCAB_SIZE


SIZES = {
    "tiny": GPTConfig(d_model=64, layers=2),  # about 0.1M parameters: unit tests, seconds
    "small": GPTConfig(d_model=128, layers=4),  # about 0.8M parameters: the demo
}


class SelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, heads, T, C / heads)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.up = nn.Linear(config.d_model, 4 * config.d_model)
        self.down = nn.Linear(4 * config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model)
        self.attn = SelfAttention(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, *, seed: int = 0):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab, config.d_model)
        self.pos_emb = nn.Embedding(config.context, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm_f = nn.LayerNorm(config.d_model)
        self._init_weights(seed)

    def _init_weights(self, seed: int) -> None:
        # A private generator: every node builds the same initial model without touching global RNG state.
        generator = torch.Generator().manual_seed(seed)
        # Residual projections are scaled down so that the residual stream's variance does not grow with depth.
        residual_std = 0.02 / math.sqrt(2 * self.config.layers)
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.down.weight")):
                nn.init.normal_(p, 0.0, residual_std, generator=generator)
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02, generator=generator)
            elif "norm" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, T) byte ids -> (B, T, vocab) logits."""
        T = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        # Tied embeddings: the output head reuses tok_emb's matrix, so there is no second tensor to name.
        return self.norm_f(x) @ self.tok_emb.weight.T


def build_model(size: str = "small", *, seed: int = 0) -> GPT:
    if size not in SIZES:
        raise ValueError(f"model size {size!r} is unknown; choose one of {sorted(SIZES)}")
    return GPT(SIZES[size], seed=seed)


def loss_on(model: GPT, windows: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy in nats over (B, 129) windows."""
    logits = model(windows[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


# The AdamW recipe of §8. Norms, biases and embeddings carry no weight decay, as in nanoGPT.
PEAK_LR = 1e-3
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
CLIP = 1.0


def make_optimizer(model: nn.Module, lr: float = PEAK_LR) -> torch.optim.AdamW:
    decay = [p for name, p in model.named_parameters() if p.dim() == 2 and "emb" not in name]
    no_decay = [p for name, p in model.named_parameters() if not (p.dim() == 2 and "emb" not in name)]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=BETAS)


def lr_at(step: int, warmup: int = 20) -> float:
    """Linear warm-up over `warmup` steps, then constant: a run cut short at any step is a fair sample."""
    return PEAK_LR * min(1.0, (step + 1) / warmup)


def train_step(
    model: GPT, optimizer: torch.optim.Optimizer, batch: torch.Tensor, *, lr: float | None = None
) -> float:
    """One AdamW step on a (B, 129) batch, gradient norm clipped to 1.0; returns the batch's loss."""
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    model.train()
    loss = loss_on(model, batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    return loss.item()


@torch.no_grad()
def evaluate(model: GPT, windows: torch.Tensor, *, chunk: int = 64) -> float:
    """Mean cross-entropy in nats over held-out windows, in fixed chunks so the result never depends on memory."""
    model.eval()
    total = sum(loss_on(model, part).item() * len(part) for part in windows.split(chunk))
    return total / len(windows)
