"""The usage of GradientMail's README (shared/seeds/003), with `gm` replaced by `sl` and a DirMailbox in
place of the bucket, runs unchanged: two nodes, side by side, each with its own model and data."""

import threading

import numpy as np
import torch

import slowlink as sl
from slowlink.demo.model import build_model, make_optimizer
from slowlink.demo.model import train_step as demo_train_step


def node(index: int, folder, results: dict) -> None:
    torch.manual_seed(index)
    model = build_model("tiny", seed=0)
    optimizer = make_optimizer(model)
    generator = np.random.default_rng(index)
    text = np.frombuffer(b"def f(x):\n    return x + 1\n" * 200, dtype=np.uint8)
    starts = generator.integers(0, len(text) - 130, size=(220, 4))
    dataloader = [torch.from_numpy(text[s[:, None] + np.arange(129)].astype(np.int64)) for s in starts]

    def train_step(model, optimizer, batch):
        return demo_train_step(model, optimizer, batch)

    # ---- GradientMail's README, `gm` → `sl`, S3Mailbox → DirMailbox ----
    with sl.Session(
        model,
        algorithm=sl.DiLoCo(sync_every=100, fragments=8),
        mailbox=sl.DirMailbox(folder / "experiments" / "run-1"),
        node_id=f"node-{index}",
        poll_seconds=0.05,
    ) as session:
        for batch in dataloader:
            loss = train_step(model, optimizer, batch)
            session.step(samples=len(batch))
    # ---- end of the README's usage ----
    results[index] = (session.stats, loss)


def test_the_gradientmail_readme_usage_runs_unchanged_with_sl(tmp_path):
    results: dict = {}
    threads = [threading.Thread(target=node, args=(i, tmp_path, results)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert sorted(results) == [0, 1]
    stats = [results[i][0] for i in range(2)]
    # fragments=8 with BalancedBytes over the tiny GPT's tensors: eight groups; each syncs once by step 220.
    assert len(stats[0].versions) == 8
    assert sum(s.rounds_merged for s in stats) >= 8
    assert all(s.contributions_sent >= 8 for s in stats)
    assert all(results[i][1] < 3.0 for i in range(2))  # the loss of a repeated line fell far below ln 256
    evaluator = build_model("tiny", seed=123)
    versions = sl.align(evaluator, mailbox=sl.DirMailbox(tmp_path / "experiments" / "run-1"))
    assert min(versions.values()) >= 1
