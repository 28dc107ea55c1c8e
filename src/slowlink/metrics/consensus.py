"""How far apart M models are (research/algorithms.md §4.4): the relative L2 distance of their parameters
from the mean, (1/M)·Σ‖x_i − x̄‖² / ‖x̄‖², and the generalized Jensen–Shannon divergence of their next-token
distributions on a fixed batch, H(p̄) − (1/M)·Σ H(p_i) in nats per token, p̄ the mean distribution. The JS
figure lies in [0, ln M]; it is 0 exactly when all models predict alike, whatever their parameters.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class Consensus:
    l2: float  # relative L2 distance of the parameters from their mean
    js: float | None  # generalized JS divergence, nats per token; None without a batch


def _named_arrays(item: object) -> dict[str, np.ndarray]:
    if isinstance(item, Mapping):
        return {name: np.asarray(values, dtype=np.float64) for name, values in item.items()}
    named = getattr(item, "named_parameters", None)
    if named is None:
        raise ConfigError(f"{type(item).__name__} is neither a model nor a dict of parameters: pass torch "
                          "modules or {name: array} dicts")  # fmt: skip
    return {name: p.detach().to("cpu").double().numpy() for name, p in named()}


def l2_consensus(models_or_params: Sequence[object]) -> float:
    """(1/M)·Σ_i ‖x_i − x̄‖² / ‖x̄‖² over every tensor (float64); 0 for identical models."""
    arrays = [_named_arrays(item) for item in models_or_params]
    if not arrays:
        raise ConfigError("l2_consensus needs at least one model")
    names = sorted(arrays[0])
    if any(sorted(a) != names for a in arrays[1:]):
        raise ConfigError("the models' parameter names differ: consensus compares models of one schema")
    spread = norm = 0.0
    for name in names:
        stacked = np.stack([a[name] for a in arrays])
        mean = stacked.mean(axis=0)
        spread += float(np.square(stacked - mean).sum()) / len(arrays)
        norm += float(np.square(mean).sum())
    return spread / norm if norm > 0 else spread


def js_consensus(models: Sequence[object], batch: object) -> float:
    """H(p̄) − (1/M)·Σ H(p_i) of the models' softmax outputs on `batch`, averaged over its positions.
    Each model is called as model(batch) and returns logits (..., vocab) (a tuple: its first element)."""
    import torch

    if not models:
        raise ConfigError("js_consensus needs at least one model")
    with torch.no_grad():
        logps = []
        for model in models:
            out = model(batch)
            logits = out[0] if isinstance(out, tuple) else out
            logps.append(torch.log_softmax(logits.double(), dim=-1).reshape(-1, logits.shape[-1]))
        stacked = torch.stack(logps)  # (M, positions, vocab)
        entropy = -(stacked.exp() * stacked).sum(-1)  # H(p_i) per position
        mean_logp = torch.logsumexp(stacked, dim=0) - np.log(len(models))  # log p̄
        mean_entropy = -(mean_logp.exp() * mean_logp).sum(-1)
        return max(0.0, float((mean_entropy - entropy.mean(0)).mean()))


def consensus(models_or_params: Sequence[object], batch: object = None) -> Consensus:
    """Both figures: L2 of the parameters, and JS of the models' predictions on `batch` (models only)."""
    return Consensus(
        l2_consensus(models_or_params), js_consensus(models_or_params, batch) if batch is not None else None
    )
