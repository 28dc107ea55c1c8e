"""The DDP part of the island test (islands_node.py runs it): ROLE "island" is rank RANK of a 2-rank gloo
island (DDP) that is one node, ROLE "single" a plain node. Each records, after every step, the commits its
model is aligned with and a digest of its parameters.
"""

import hashlib
import json
from pathlib import Path

import torch
import torch.distributed as dist

import slowlink as sl

METHOD = {"sync_every": 3, "fragments": 2, "quorum_size": 2, "overlap_steps": 1, "outer_lr": 0.7}


def refused_fsdp1(mailbox: Path) -> str:
    """FSDP1's flat parameters are not the model's tensors: refused on every rank, naming the fix."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    flat = FullyShardedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 2)), device_id=torch.device("cpu")
    )
    try:
        sl.Session(flat, algorithm=sl.DiLoCo(sync_every=3), mailbox=mailbox, island=dist.group.WORLD).start()
    except sl.ConfigError as error:
        return str(error)
    return ""


def failed_join(model, mailbox: Path) -> str:
    """A join rank 0 cannot make (the run's configuration differs): the error each rank raises."""
    try:
        sl.Session(model, algorithm=sl.DiLoCo(sync_every=5), mailbox=mailbox, island=dist.group.WORLD).start()
    except sl.SlowlinkError as error:
        return type(error).__name__
    return ""


def run(role: str, rank: int, mailbox: Path, out: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    options, found = {}, {}
    if role == "island":
        model = torch.nn.parallel.DistributedDataParallel(model)
        options["island"] = dist.group.WORLD
        found["refused"] = refused_fsdp1(mailbox)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank + (10 if role == "single" else 0))
    trace = []
    with sl.Session(model, algorithm=sl.DiLoCo(**METHOD), mailbox=mailbox, node_id=role, poll_seconds=0.02,
                    lease_seconds=10.0, **options) as session:  # fmt: skip
        for step in range(12):
            x = torch.randn(4, 6, generator=data)
            loss = (model(x) - x[:, :2]).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            session.step(samples=4)
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            trace.append(
                [step, list(session.stats.versions), hashlib.sha256(flat.numpy().tobytes()).hexdigest()]
            )
        stats = session.stats
    found |= {"trace": trace, "final": [p.detach().tolist() for p in model.parameters()],
              "sent": stats.contributions_sent, "late": stats.contributions_late, "applied": stats.commits_applied,
              "bytes_sent": stats.bytes_sent, "left_at": list(session.stats.versions)}  # fmt: skip
    if role == "island":
        found["failed_join"] = failed_join(model, mailbox)
    out.write_text(json.dumps(found))
