"""One process of the FSDP island test: python fsdp_node.py ROLE RANK PORT MAILBOX OUT.json

ROLE "island": rank RANK of a 2-rank gloo island whose model is sharded by FSDP2's fully_shard (7 and 3 rows:
uneven shards); ROLE "single": a plain node of the same model. Each records, after every step, the commits
it holds (its anchors: the island's ranks their shards of them) and, on leaving, its model.
"""

import json
import sys
import time
import tracemalloc
from pathlib import Path

import torch
import torch.distributed as dist

import slowlink as sl
from slowlink.collective.island import IslandLead
from slowlink.protocol.courier import Courier

role, rank, port, mailbox, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
options = {}
if role == "island":
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    fully_shard(model)
    options["island"] = dist.group.WORLD
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(100 + rank + (10 if role == "single" else 0))
method = sl.DiLoCo(sync_every=3, fragments=2, quorum_size=2, overlap_steps=1, outer_lr=0.7)
anchors: dict[str, dict[str, list]] = {}  # "fragment:version" -> name -> the values this process holds
(Path(mailbox).parent / f"ready-{role}{rank}").touch()
while len(list(Path(mailbox).parent.glob("ready-*"))) < 3:
    time.sleep(0.02)
with sl.Session(
    model, algorithm=method, mailbox=mailbox, node_id=role, poll_seconds=0.02, lease_seconds=10.0, **options
) as session:
    # Training starts once both nodes see each other (fully_shard makes the island slower to join), so
    # that rounds commit with both; rank 1 follows rank 0 in lockstep.
    deadline = time.monotonic() + 60
    while (
        (role == "single" or rank == 0)
        and len(session.courier.live_nodes()) < 2
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
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
    stats = session.stats
local = {
    name: (p.to_local() if hasattr(p, "to_local") else p).detach().tolist()
    for name, p in model.named_parameters()
}
Path(out).write_text(
    json.dumps(
        {
            "anchors": anchors,
            "final": local,
            "left_at": list(stats.versions),
            "applied": stats.commits_applied,
            "bytes_sent": stats.bytes_sent,
        }
    )
)
if role == "island":
    # Rank 0's host allocations while it streams contributions: a model of 16 tensors in a run of its own.
    probe = torch.nn.Sequential(*[torch.nn.Linear(96, 96, bias=False) for _ in range(16)])
    fully_shard(probe)
    # From publishing a contribution to its upload (done by the communication thread), the peak of rank 0's
    # traced host allocations over what it held before; a window in which a commit came counts apart.
    windows, window = [], {}
    publish, upload, deliver = IslandLead.publish, Courier._upload, Courier._deliver

    def measured(lead, contribution):
        tracemalloc.reset_peak()
        window.update(before=tracemalloc.get_traced_memory()[0], delivered=False)
        publish(lead, contribution)

    def uploaded(courier, item):
        upload(courier, item)
        peak = tracemalloc.get_traced_memory()[1] - window.pop("before")
        windows.append([peak, len(item.prepared[0]), window["delivered"]])

    def delivered(courier, *args):
        window["delivered"] = True
        deliver(courier, *args)

    IslandLead.publish, Courier._upload, Courier._deliver = measured, uploaded, delivered
    tracemalloc.start()
    with sl.Session(probe, algorithm=sl.DiLoCo(sync_every=2, overlap_steps=0, delta_dtype="BF16"), mailbox=f"{mailbox}-probe",
                    node_id="probe", poll_seconds=0.02, island=dist.group.WORLD) as session:  # fmt: skip
        for _ in range(4):
            probe(torch.randn(2, 96)).pow(2).mean().backward()
            with torch.no_grad():
                for p in probe.parameters():
                    p -= 0.1 * p.grad
            session.step(samples=2)
    tracemalloc.stop()
    memory = {"windows": windows, "tensor": 96 * 96 * 4, "fragment": 16 * 96 * 96 * 4}
    Path(out).write_text(json.dumps({**json.loads(Path(out).read_text()), "memory": memory}))
    # A join rank 0 cannot make (the run's configuration differs): rank 0 raises why, the other rank stops too.
    try:
        sl.Session(model, algorithm=sl.DiLoCo(sync_every=5), mailbox=mailbox, island=dist.group.WORLD).start()
        failed = ""
    except sl.SlowlinkError as error:
        failed = type(error).__name__
    Path(out).write_text(json.dumps({**json.loads(Path(out).read_text()), "failed_join": failed}))
    # Parameters replicated over the mesh (not fully_shard's rows): refused on every rank, naming the tensor.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_module

    replicated = distribute_module(torch.nn.Linear(4, 4), init_device_mesh("cpu", (2,)))
    try:
        sl.Session(replicated, algorithm=method, mailbox=mailbox, island=dist.group.WORLD).start()
        refused = ""
    except sl.ConfigError as error:
        refused = str(error)
    Path(out).write_text(json.dumps({**json.loads(Path(out).read_text()), "refused": refused}))
    dist.destroy_process_group()
