"""Helpers to run several sessions side by side in one process, one thread each, on a shared mailbox."""

import threading

import torch

import slowlink as sl

# Sessions here run as threads of one process, which share torch's global generator: seeding it and drawing
# a model's initial weights is one step under this lock, or two threads' draws interleave and their nodes
# start from different models (the race that made a threaded exactness test fail one run in ten).
SEEDED_INIT = threading.Lock()


def tiny_mlp(seed: int = 0) -> torch.nn.Module:
    with SEEDED_INIT:
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def batches(node: int, steps: int, size: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(100 + node)
    out = []
    for _ in range(steps):
        x = torch.randn(size, 3, generator=generator)
        out.append((x, torch.sin(x.sum(dim=1, keepdim=True))))
    return out


def sgd_step(model: torch.nn.Module, batch, lr: float) -> float:
    x, y = batch
    loss = ((model(x) - y) ** 2).mean()
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return loss.item()


def wide_mlp(seed: int = 0) -> torch.nn.Module:
    """67k parameters: payloads large enough that their bytes, not the records', dominate the traffic."""
    with SEEDED_INIT:
        torch.manual_seed(seed)
        return torch.nn.Sequential(
            torch.nn.Linear(3, 256),
            torch.nn.Tanh(),
            torch.nn.Linear(256, 256),
            torch.nn.Tanh(),
            torch.nn.Linear(256, 1),
        )


def run_nodes(
    count: int, algorithm, mailbox, steps: int, *, lr: float = 0.1, make_model=tiny_mlp, **session_options
):
    """Train `count` models from the same start, each on its own batches; returns their models and stats."""
    models = [make_model() for _ in range(count)]
    stats, errors = [None] * count, []
    barrier = threading.Barrier(count)

    def node(i: int) -> None:
        try:
            with sl.Session(models[i], algorithm=algorithm, mailbox=mailbox, node_id=f"node-{i}",
                            poll_seconds=0.005, **session_options) as session:  # fmt: skip
                barrier.wait()  # every node holds a lease before anyone trains
                for batch in batches(i, steps):
                    sgd_step(models[i], batch, lr)
                    session.step(samples=len(batch[0]))
            stats[i] = session.stats
        except BaseException as error:  # surfaced by the caller
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=node, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors:
        raise errors[0]
    return models, stats
