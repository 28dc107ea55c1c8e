"""The training both sides of the process-group test run: a small model, each node's own seeded data."""

import threading
import time

import torch

import slowlink as sl

METHOD = {"sync_every": 4, "fragments": 2, "quorum_size": 2, "overlap_steps": 0, "outer_lr": 0.7}
STEPS = 16
# The mailbox side runs its nodes as threads of one process, which share torch's global generator: seeding
# it and drawing the initial weights must be one step, or the threads' draws interleave and the nodes start
# from different models (the gloo side's processes each have their own generator).
_SEEDED_INIT = threading.Lock()


def train(rank: int, **session) -> tuple[dict[str, torch.Tensor], sl.SessionStats]:
    with _SEEDED_INIT:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)
    with sl.Session(
        model, algorithm=sl.DiLoCo(**METHOD), node_id=f"rank-{rank}", poll_seconds=0.02, **session
    ) as run:
        # A barrier round closes on "every live node reported": a merger that has not yet read the other
        # node's lease would close round 1 alone. Both runs start once both nodes see each other.
        deadline = time.monotonic() + 60
        while len(run.courier.live_nodes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(STEPS):
            x = torch.randn(4, 6, generator=data)
            loss = (model(x) - x[:, :2]).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            run.step(samples=4)
    return {name: p.detach().clone() for name, p in model.named_parameters()}, run.stats
