"""A Hugging Face Trainer in a run: two learner processes each train a tiny GPT-2 (built from a config, no
download) with `transformers.Trainer`, joined only by a directory; SlowlinkCallback is the one line added
to the Trainer. Then the committed model is evaluated.

    pip install transformers accelerate         # (in the dev extra)
    python examples/hf_trainer.py               # 200 steps per node, a few minutes on a 2-core CPU
    python examples/hf_trainer.py --steps 20    # the short form the tests run
"""

import argparse
import multiprocessing
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is built from its config: nothing to download

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, PrinterCallback, Trainer, TrainingArguments  # noqa: E402

import slowlink as sl  # noqa: E402
from slowlink.demo.corpus import CONTEXT, TrainWindows, heldout_windows, load_corpus  # noqa: E402
from slowlink.integrations.transformers import SlowlinkCallback  # noqa: E402

PER_DEVICE, ACCUMULATION = 4, 2  # one optimizer step trains on 8 windows


def build_model(seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=256, n_positions=CONTEXT, n_embd=64, n_layer=2, n_head=4, bos_token_id=0,
                        eos_token_id=0, tie_word_embeddings=True)  # bytes as tokens  # fmt: skip
    return GPT2LMHeadModel(config)


def windows(node: int, count: int) -> list[dict]:
    """`count` windows of the Python standard library's source, drawn by this node (the model shifts labels)."""
    rows = TrainWindows(load_corpus(), node=node).next_batch(count)[:, :CONTEXT]
    return [{"input_ids": row, "labels": row} for row in rows]


def heldout_loss(model: GPT2LMHeadModel) -> float:
    model.eval()
    rows = heldout_windows(load_corpus(), count=32)[:, :CONTEXT]
    with torch.no_grad():
        return model(input_ids=rows, labels=rows).loss.item()


def learner(node: int, folder: str, steps: int) -> None:
    torch.set_num_threads(1)  # two processes share two cores
    model = build_model(seed=0)  # every node builds the same architecture
    session = sl.Session(model, algorithm=sl.DiLoCo(sync_every=10), mailbox=folder, node_id=f"node-{node}")
    args = TrainingArguments(
        output_dir=os.path.join(folder, f"trainer-{node}"), per_device_train_batch_size=PER_DEVICE,
        gradient_accumulation_steps=ACCUMULATION, max_steps=steps, learning_rate=3e-3, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, log_level="error",
    )  # fmt: skip
    data = windows(node, steps * PER_DEVICE * ACCUMULATION)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[SlowlinkCallback(session)])
    trainer.remove_callback(PrinterCallback)  # two processes printing every step's logs would be noise
    trainer.train()  # the callback joins the run, steps the session, and leaves when training ends
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print(f"node-{node}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, {session.stats.samples} samples, "
          f"{session.stats.commits_applied} commits applied")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per node")
    steps = parser.parse_args().steps
    folder = tempfile.mkdtemp(prefix="slowlink-hf-")
    context = multiprocessing.get_context("spawn")
    nodes = [context.Process(target=learner, args=(i, folder, steps)) for i in range(2)]
    for node in nodes:
        node.start()
    for node in nodes:
        node.join()
    model = build_model(seed=0)
    before = heldout_loss(model)
    versions = sl.align(model, mailbox=folder)  # newest committed model, for evaluation
    print(
        f"held-out loss: {before:.3f} at the start, {heldout_loss(model):.3f} committed at versions {versions}"
    )
    return max(node.exitcode for node in nodes)


if __name__ == "__main__":
    sys.exit(main())
