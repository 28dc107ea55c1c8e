"""A small seeded DeMo run shared by the simulator, gloo and mailbox tests: each node fits its own
least-squares batch; the same seed gives the same model on every node."""

import torch

import slowlink as sl

STEPS, LR, OPTIONS = 6, 0.01, {"topk": 8, "chunk": 32, "values": "2bit"}


def model() -> torch.nn.Module:
    net = torch.nn.Sequential(torch.nn.Linear(12, 96), torch.nn.Tanh(), torch.nn.Linear(96, 3))
    generator = torch.Generator().manual_seed(0)  # not the global RNG: nodes may start in threads at once
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=generator))
    return net


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, 12, generator=generator), torch.randn(16, 3, generator=generator)


def mse(net: torch.nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.mse_loss(net(data[0]), data[1])


def train(rank: int, exchange, **options) -> dict[str, torch.Tensor]:
    net = model()
    optimizer = sl.DeMo(net.parameters(), LR, exchange=exchange, **{**OPTIONS, **options})
    for step in range(STEPS):
        optimizer.zero_grad()
        mse(net, batch(rank, step)).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in net.named_parameters()}
