"""One process of the FSDP island test: python fsdp_node.py ROLE RANK PORT MAILBOX OUT.json

ROLE "island": rank RANK of a 2-rank gloo island whose model is sharded by FSDP2's fully_shard (7 and 3 rows:
uneven shards); ROLE "single": a plain node of the same model. Each records, after every step, the commits
it holds (its anchors: the island's ranks their shards of them) and, on leaving, its model.
"""

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import slowlink as sl

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
