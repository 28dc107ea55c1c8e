"""A small seeded DeMo run shared by the in-process and the gloo tests: each node fits its own least-squares
batch; the same seed gives the same model on every node."""

import torch

import slowlink as sl

STEPS, LR = 6, 0.01


def model() -> torch.nn.Module:
    net = torch.nn.Sequential(torch.nn.Linear(12, 96), torch.nn.Tanh(), torch.nn.Linear(96, 3))
    generator = torch.Generator().manual_seed(0)  # not the global RNG: nodes may start in threads at once
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=generator))
    return net


def train(rank: int, exchange, **options) -> dict[str, torch.Tensor]:
    net = model()
    optimizer = sl.DeMo(net.parameters(), LR, topk=8, chunk=32, exchange=exchange, **options)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(16, 12, generator=generator), torch.randn(16, 3, generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in net.named_parameters()}
