"""The demo model: its size, its parameter names, that it learns, and that evaluation is deterministic."""

import itertools
import re

import pytest
import torch

from slowlink.demo.model import (
    GPT,
    GPTConfig,
    build_model,
    evaluate,
    lr_at,
    make_optimizer,
    train_step,
)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_small_has_about_0_8_million_parameters_and_tiny_about_0_1_million():
    # Per block 12 d^2 + 13 d (attention, MLP, biases, two norms); plus 256 d + 128 d embeddings and a norm.
    d = 128
    assert count(build_model("small")) == 4 * (12 * d * d + 13 * d) + 384 * d + 2 * d == 842_496
    assert count(build_model("tiny")) == 2 * (12 * 64 * 64 + 13 * 64) + 384 * 64 + 2 * 64 == 124_672


def test_block_tensors_are_named_blocks_i_and_the_rest_is_not():
    names = [name for name, _ in build_model("small").named_parameters()]
    numbered = [name for name in names if re.search(r"\.(\d+)\.", name)]
    assert {re.match(r"blocks\.(\d+)\.", name).group(1) for name in numbered} == {"0", "1", "2", "3"}
    assert sorted(set(names) - set(numbered)) == [
        "norm_f.bias",
        "norm_f.weight",
        "pos_emb.weight",
        "tok_emb.weight",
    ]


def test_the_output_head_is_the_token_embedding():
    model = build_model("tiny")
    assert "lm_head.weight" not in model.state_dict()
    with torch.no_grad():
        model.tok_emb.weight[7].zero_()
    logits = model(torch.zeros(1, 5, dtype=torch.long))
    assert torch.all(logits[..., 7] == 0)


def test_the_same_seed_builds_the_same_model_and_another_seed_does_not():
    a, b, c = build_model("tiny", seed=1), build_model("tiny", seed=1), build_model("tiny", seed=2)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)


def test_an_untrained_model_predicts_close_to_uniform_bytes():
    windows = torch.randint(0, 256, (8, 129), generator=torch.Generator().manual_seed(0))
    # ln 256 = 5.545: small initial weights give nearly uniform predictions.
    assert evaluate(build_model("tiny"), windows) == pytest.approx(5.545, abs=0.05)


def test_a_few_steps_on_one_batch_reduce_its_loss():
    model = build_model("tiny", seed=0)
    optimizer = make_optimizer(model)
    batch = torch.randint(0, 16, (4, 129), generator=torch.Generator().manual_seed(0))
    losses = [train_step(model, optimizer, batch, lr=1e-3) for _ in range(30)]
    # 16 symbols used of 256: the model learns the restricted alphabet first, ln 256 -> below ln 16 + 0.5.
    assert losses[0] == pytest.approx(5.545, abs=0.05)
    assert losses[-1] < 3.3
    assert all(later < earlier for earlier, later in itertools.pairwise(losses))


def test_evaluate_is_deterministic_does_not_train_and_does_not_depend_on_the_chunk():
    model = build_model("tiny", seed=0)
    windows = torch.randint(0, 256, (10, 129), generator=torch.Generator().manual_seed(1))
    before = [p.clone() for p in model.parameters()]
    first = evaluate(model, windows)
    assert evaluate(model, windows) == first
    assert evaluate(model, windows, chunk=3) == pytest.approx(first, rel=1e-6)
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_weight_decay_skips_norms_biases_and_embeddings():
    model = GPT(GPTConfig(d_model=32, layers=1, heads=4))
    decayed, plain = make_optimizer(model).param_groups
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.1, 0.0)
    assert {id(p) for p in decayed["params"]} == {
        id(p) for name, p in model.named_parameters() if re.search(r"(qkv|proj|up|down)\.weight$", name)
    }
    assert make_optimizer(model).defaults["betas"] == (0.9, 0.95)


def test_the_learning_rate_warms_up_linearly_then_holds_at_1e_3():
    assert [lr_at(step, warmup=4) for step in (0, 1, 3, 100)] == pytest.approx([2.5e-4, 5e-4, 1e-3, 1e-3])
