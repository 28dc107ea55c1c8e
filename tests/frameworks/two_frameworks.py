"""The same small model in PyTorch and in MLX, and one node of a run training it in either: what the tests of
an MLX node beside a torch node share. Run as a node: python two_frameworks.py ARGS_JSON OUT_JSON."""

import json
import sys
import time
from pathlib import Path

import numpy as np

import slowlink as sl

SIZES = (4, 8, 1)  # in, hidden, out: nn.Sequential(Linear, Tanh, Linear) in both frameworks
TRUE_WEIGHTS = np.array([[1.5], [-2.0], [0.5], [1.0]], np.float32)


def torch_model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(*SIZES[:2]), torch.nn.Tanh(), torch.nn.Linear(*SIZES[1:]))


def mlx_model(seed: int):
    import mlx.core as mx
    import mlx.nn as nn

    mx.random.seed(seed)
    return nn.Sequential(nn.Linear(*SIZES[:2]), nn.Tanh(), nn.Linear(*SIZES[1:]))


def batches(node: int, steps: int, batch: int = 16):
    """A regression each node samples from its own seed: y = x·w + noise."""
    rng = np.random.default_rng(100 + node)
    for _ in range(steps):
        x = rng.standard_normal((batch, SIZES[0])).astype(np.float32)
        yield x, x @ TRUE_WEIGHTS + 0.01 * rng.standard_normal((batch, 1)).astype(np.float32)


def torch_trainer(model, lr: float):
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def step(x, y) -> float:
        loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def mlx_trainer(model, lr: float):
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    optimizer = optim.SGD(learning_rate=lr)
    loss_and_grad = nn.value_and_grad(model, lambda m, x, y: nn.losses.mse_loss(m(x), y))

    def step(x, y) -> float:
        loss, grads = loss_and_grad(model, mx.array(x), mx.array(y))
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state)
        return loss.item()

    return step


def main(args: dict, out_path: str) -> None:
    framework, node = args["framework"], args["node"]
    model = (torch_model if framework == "torch" else mlx_model)(seed=node)
    train_step = (torch_trainer if framework == "torch" else mlx_trainer)(model, lr=0.05)
    if args.get("wait_for_run"):  # the other node creates the run: which node does is then known
        deadline = (
            time.monotonic() + 120
        )  # generous: the other process may be slow to start on a busy machine
        while not (Path(args["mailbox"]) / "run.json").exists():
            assert time.monotonic() < deadline, "the other node never created the run"
            time.sleep(0.05)
    losses = []
    algorithm = sl.DiLoCo(sync_every=5, quorum_size=2, overlap_steps=0, outer_lr=1.0, outer_momentum=0.0)
    with sl.Session(model, algorithm=algorithm, mailbox=sl.DirMailbox(args["mailbox"]),
                    node_id=f"{framework}-{node}", poll_seconds=0.05, lease_seconds=30.0,
                    events_file=args.get("events")) as session:  # fmt: skip
        deadline = time.monotonic() + 120
        while len(session.courier.live_nodes()) < 2:  # this node's view: a round closes on every live node
            assert time.monotonic() < deadline, "the other node never joined"
            session.courier.request_leases()
            time.sleep(0.05)
        for x, y in batches(node, args["steps"]):
            losses.append(train_step(x, y))
            session.step(samples=len(x))
    adapter = session.adapter
    final = adapter.snapshot([name for name, _, _ in adapter.schema])
    result = {"losses": losses, "commits_applied": session.stats.commits_applied,
              "contributions_sent": session.stats.contributions_sent, "versions": list(session.stats.versions),
              "final": {name: array.tolist() for name, array in final.items()}}  # fmt: skip
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    arguments = json.loads(sys.argv[1])
    if arguments["framework"] == "mlx":
        sys.modules["torch"] = None  # importing torch now fails: an MLX machine needs none
    main(arguments, sys.argv[2])
