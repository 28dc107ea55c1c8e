"""What the Trainer tests share: a tiny GPT-2 and a tiny Llama built from configs (no download; tied
embeddings, two layers, width 32, no dropout), a learnable token data set, and the Trainer's arguments."""

import hashlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: models are built from their configs
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, TrainingArguments  # noqa: E402

VOCAB, LENGTH = 48, 16
PER_DEVICE, ACCUMULATION = 4, 2  # one optimizer step trains on 8 sequences


def build_model(arch: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if arch == "gpt2":
        config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)  # fmt: skip
        return GPT2LMHeadModel(config)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=LENGTH,
                         tie_word_embeddings=True)  # fmt: skip
    return LlamaForCausalLM(config)


def dataset(node: int, size: int = 64) -> list[dict]:
    """Sequences that count up by a step of 1-3 from a random start: a pattern a tiny model learns in tens of
    steps. Each node draws its own sequences."""
    generator = torch.Generator().manual_seed(100 + node)
    starts = torch.randint(0, VOCAB, (size,), generator=generator)
    strides = torch.randint(1, 4, (size,), generator=generator)
    rows = (starts[:, None] + strides[:, None] * torch.arange(LENGTH)) % VOCAB
    return [{"input_ids": row.tolist(), "labels": row.tolist()} for row in rows]


def training_args(output_dir: str, max_steps: int, **overrides) -> TrainingArguments:
    options = dict(output_dir=output_dir, per_device_train_batch_size=PER_DEVICE,
                   gradient_accumulation_steps=ACCUMULATION, max_steps=max_steps, learning_rate=3e-3,
                   lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to="none",
                   use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0)  # fmt: skip
    return TrainingArguments(**{**options, **overrides})


def losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def digest(model: torch.nn.Module) -> str:
    """sha256 of the parameters, in model order."""
    return hashlib.sha256(
        b"".join(p.detach().float().numpy().tobytes() for p in model.parameters())
    ).hexdigest()
