"""The README's snippet as a runnable file: two learner processes train one byte-level GPT on the Python
standard library's source, joined only by a directory, then the committed model is evaluated.

    python examples/quickstart.py            # about a minute on a 2-core CPU

Each process runs `learner()`: a plain PyTorch training loop with three slowlink lines added.
"""

import multiprocessing
import sys
import tempfile

import torch

import slowlink as sl
from slowlink.demo.corpus import TrainWindows, heldout_windows, load_corpus
from slowlink.demo.model import build_model, evaluate, make_optimizer, train_step

STEPS, BATCH = 200, 8


def learner(node: int, folder: str) -> None:
    torch.set_num_threads(1)  # two processes share two cores
    model = build_model("tiny", seed=0)  # every node builds the same architecture
    optimizer = make_optimizer(model)
    windows = TrainWindows(load_corpus(), node=node)
    loader = (windows.next_batch(BATCH) for _ in range(STEPS))

    with sl.Session(
        model,
        algorithm=sl.DiLoCo(sync_every=50, fragments=2),
        mailbox=sl.DirMailbox(folder),
        node_id=f"node-{node}",
    ) as session:
        for batch in loader:
            loss = train_step(model, optimizer, batch)
            session.step(samples=len(batch))
    print(f"node-{node}: last loss {loss:.3f}, {session.stats.commits_applied} commits applied, "
          f"{session.stats.bytes_sent / 1e6:.1f} MB sent")  # fmt: skip


def main() -> int:
    folder = tempfile.mkdtemp(prefix="slowlink-quickstart-")
    context = multiprocessing.get_context("spawn")
    nodes = [context.Process(target=learner, args=(i, folder)) for i in range(2)]
    for node in nodes:
        node.start()
    for node in nodes:
        node.join()
    model = build_model("tiny", seed=1)
    versions = sl.align(model, mailbox=sl.DirMailbox(folder))  # newest committed model, for evaluation
    print(
        f"committed model at versions {versions}: held-out loss {evaluate(model, heldout_windows(load_corpus())):.3f}"
    )
    return max(node.exitcode for node in nodes)


if __name__ == "__main__":
    sys.exit(main())
