"""BatchNorm in a run: two learner processes train a small MLP with BatchNorm, joined only by a directory.
The running statistics travel with the parameters, so the nodes end with the same statistics and the
committed model, loaded with sl.align, classifies well in eval mode.

    python examples/batchnorm.py               # 300 steps per node, under a minute on a 2-core CPU
    python examples/batchnorm.py --steps 40    # the short form the tests run
"""

import argparse
import multiprocessing
import sys
import tempfile
import time

import torch

import slowlink as sl

CLASSES, FEATURES, BATCH = 4, 8, 32


def build_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES)
    )


def batch(generator: torch.Generator, size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Four Gaussian blobs, away from BatchNorm's initial statistics (mean 0, var 1)."""
    centers = torch.Generator().manual_seed(0)  # the same blobs on every node
    means = torch.randn(CLASSES, FEATURES, generator=centers) * 3
    labels = torch.randint(0, CLASSES, (size,), generator=generator)
    return 3 + 2 * (means[labels] + torch.randn(size, FEATURES, generator=generator)), labels


def accuracy(model: torch.nn.Module) -> float:
    model.eval()  # BatchNorm normalizes with its running statistics
    inputs, labels = batch(torch.Generator().manual_seed(999), size=1000)
    with torch.no_grad():
        return (model(inputs).argmax(1) == labels).float().mean().item()


def learner(node: int, folder: str, steps: int) -> None:
    torch.set_num_threads(1)  # two processes share two cores
    model = build_model(seed=0)  # every node builds the same architecture
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(node)  # each node its own data
    mailbox = sl.DirMailbox(folder)
    # Standard DiLoCo: every round waits for both nodes, so they end on the same commit.
    with sl.Session(model, algorithm=sl.DiLoCo(sync_every=10, quorum_size=2, overlap_steps=0),
                    mailbox=mailbox, node_id=f"node-{node}") as session:  # fmt: skip
        while len(mailbox.list("nodes/")) < 2:
            time.sleep(0.05)  # both nodes hold a lease before the first round
        for _ in range(steps):
            model.train()
            inputs, labels = batch(generator)
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            session.step(samples=len(labels))
    statistics = model[1].running_mean[:3].tolist()  # the run's: the same on both nodes
    print(f"node-{node}: last loss {loss.item():.3f}, versions {list(session.stats.versions)}, "
          f"running_mean[:3] {[round(value, 4) for value in statistics]}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per node")
    steps = parser.parse_args().steps
    folder = tempfile.mkdtemp(prefix="slowlink-batchnorm-")
    context = multiprocessing.get_context("spawn")
    nodes = [context.Process(target=learner, args=(i, folder, steps)) for i in range(2)]
    for node in nodes:
        node.start()
    for node in nodes:
        node.join()
    model = build_model(seed=1)
    print(f"a fresh model in eval mode: accuracy {accuracy(model):.2f}")
    versions = sl.align(model, mailbox=sl.DirMailbox(folder))  # parameters and running statistics
    print(f"committed model at versions {versions}, in eval mode: accuracy {accuracy(model):.2f}")
    model[1].reset_running_stats()  # what a run that ignored the buffers would have left
    print(f"committed parameters with BatchNorm's initial statistics: accuracy {accuracy(model):.2f}")
    return max(node.exitcode for node in nodes)


if __name__ == "__main__":
    sys.exit(main())
