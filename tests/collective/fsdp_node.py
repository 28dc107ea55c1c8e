"""The FSDP2 part of the island test (islands_node.py runs it): ROLE "island" is rank RANK of a 2-rank gloo
island whose model is sharded by fully_shard (7 and 3 rows: uneven shards), ROLE "single" a plain node of the
same model. Each records, after every step, the commits it holds (its anchors: the island's ranks their shards
of them) and, on leaving, its model; then rank 0's host allocations while it streams contributions.
"""

import json
import time
import tracemalloc
from pathlib import Path

import torch
import torch.distributed as dist

import slowlink as sl
from slowlink.collective.island import IslandLead
from slowlink.protocol.courier import Courier
from tests.collective.island_node import failed_join

METHOD = {"sync_every": 3, "fragments": 2, "quorum_size": 2, "overlap_steps": 1, "outer_lr": 0.7}
PROBE_TENSORS, PROBE_WIDTH = 16, 96


def train(session, model, role: str, rank: int) -> dict:
    """12 steps once both nodes see each other (fully_shard makes the island slower to join), so that rounds
    commit with both (rank 1 follows rank 0 in lockstep); the anchors held after every step."""
    deadline = time.monotonic() + 60
    while (
        (role == "single" or rank == 0)
        and len(session.courier.live_nodes()) < 2
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank + (10 if role == "single" else 0))
    anchors: dict[str, dict[str, list]] = {}  # "fragment:version" -> name -> the values this process holds
    for _ in range(12):
        time.sleep(0.02)
        x = torch.randn(4, 6, generator=data)
        loss = (model(x) - x[:, :3]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        session.step(samples=4)
        for q, (version, params) in session.node.anchors.items():
            anchors[f"{q}:{version}"] = {name: torch.as_tensor(v).tolist() for name, v in params.items()}
    return anchors


def run(role: str, rank: int, mailbox: Path, out: Path) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    options = {}
    if role == "island":
        fully_shard(model)
        options["island"] = dist.group.WORLD
    with sl.Session(model, algorithm=sl.DiLoCo(**METHOD), mailbox=mailbox, node_id=role, poll_seconds=0.02,
                    lease_seconds=10.0, **options) as session:  # fmt: skip
        anchors = train(session, model, role, rank)
        stats = session.stats
    local = {name: (p.to_local() if hasattr(p, "to_local") else p).detach().tolist()
             for name, p in model.named_parameters()}  # fmt: skip
    found = {"anchors": anchors, "final": local, "left_at": list(stats.versions),
             "applied": stats.commits_applied, "bytes_sent": stats.bytes_sent}  # fmt: skip
    if role == "island":
        found["memory"] = probe_memory(mailbox.parent / "probe", rank)
        found["failed_join"] = failed_join(model, mailbox)
        found["refused"] = refused_replicated(mailbox)
    out.write_text(json.dumps(found))


def probe_memory(mailbox: Path, rank: int) -> dict:
    """An island of a model of 16 tensors alone in a run, BF16 contributions: for each, the peak of rank 0's
    traced host allocations from publishing it to its upload (the communication thread's), over what rank 0
    held before; a window in which a commit came is marked (its decoding is the protocol's, not the stream's)."""
    from torch.distributed.fsdp import fully_shard

    probe = torch.nn.Sequential(
        *[torch.nn.Linear(PROBE_WIDTH, PROBE_WIDTH, bias=False) for _ in range(PROBE_TENSORS)]
    )
    fully_shard(probe)
    windows, window = [], {}
    publish, upload, deliver = IslandLead.publish, Courier._upload, Courier._deliver

    def measured(lead, contribution):
        tracemalloc.reset_peak()
        window.update(before=tracemalloc.get_traced_memory()[0], delivered=False)
        publish(lead, contribution)

    def uploaded(courier, item):
        upload(courier, item)
        windows.append([tracemalloc.get_traced_memory()[1] - window.pop("before"), len(item.prepared[0]),
                        window["delivered"]])  # fmt: skip

    def delivered(courier, *args):
        window["delivered"] = True
        deliver(courier, *args)

    IslandLead.publish, Courier._upload, Courier._deliver = measured, uploaded, delivered
    if rank == 0:
        tracemalloc.start()
    method = sl.DiLoCo(sync_every=2, overlap_steps=0, delta_dtype="BF16")
    with sl.Session(probe, algorithm=method, mailbox=mailbox, node_id="probe", poll_seconds=0.02,
                    island=dist.group.WORLD) as session:  # fmt: skip
        for _ in range(4):
            probe(torch.randn(2, PROBE_WIDTH)).pow(2).mean().backward()
            with torch.no_grad():
                for p in probe.parameters():
                    p -= 0.1 * p.grad
            session.step(samples=2)
    tracemalloc.stop()
    IslandLead.publish, Courier._upload, Courier._deliver = publish, upload, deliver
    tensor = PROBE_WIDTH * PROBE_WIDTH * 4
    return {"windows": windows, "tensor": tensor, "fragment": PROBE_TENSORS * tensor}


def refused_replicated(mailbox: Path) -> str:
    """Parameters replicated over the mesh (not fully_shard's rows): refused on every rank, naming the tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_module

    replicated = distribute_module(torch.nn.Linear(4, 4), init_device_mesh("cpu", (2,)))
    try:
        sl.Session(
            replicated, algorithm=sl.DiLoCo(**METHOD), mailbox=mailbox, island=dist.group.WORLD
        ).start()
    except sl.ConfigError as error:
        return str(error)
    return ""
