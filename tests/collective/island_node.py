"""One process of the island test: python island_node.py ROLE RANK PORT MAILBOX OUT.json

ROLE "island": rank RANK of a 2-rank gloo island (DDP) that is one node; ROLE "single": a plain node. Each
records, after every step, the commits its model is aligned with and a digest of its parameters.
"""

import hashlib
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
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
options, refused = {}, None
if role == "island":
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(model)
    options["island"] = dist.group.WORLD
    # FSDP1's flat parameters are not the model's tensors: refused on every rank, naming the fix.
    from torch.distributed.fsdp import FullyShardedDataParallel

    flat = FullyShardedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 2)), device_id=torch.device("cpu")
    )
    try:
        sl.Session(flat, algorithm=sl.DiLoCo(sync_every=3), mailbox=mailbox, island=dist.group.WORLD).start()
        refused = ""
    except sl.ConfigError as error:
        refused = str(error)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(100 + rank + (10 if role == "single" else 0))
method = sl.DiLoCo(sync_every=3, fragments=2, quorum_size=2, overlap_steps=1, outer_lr=0.7)
trace = []
# All three processes enter together (imports take long on a busy machine): a node alone commits by itself.
(Path(mailbox).parent / f"ready-{role}{rank}").touch()
while len(list(Path(mailbox).parent.glob("ready-*"))) < 3:
    time.sleep(0.02)
with sl.Session(
    model, algorithm=method, mailbox=mailbox, node_id=role, poll_seconds=0.02, lease_seconds=10.0, **options
) as session:
    for step in range(12):
        x = torch.randn(4, 6, generator=data)
        loss = (model(x) - x[:, :2]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        session.step(samples=4)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        trace.append([step, list(session.stats.versions), hashlib.sha256(flat.numpy().tobytes()).hexdigest()])
    stats = session.stats
final = [p.detach().tolist() for p in model.parameters()]
left_at = list(session.stats.versions)  # the commits leaving aligned the model with
Path(out).write_text(
    json.dumps(
        {
            "trace": trace,
            "final": final,
            "sent": stats.contributions_sent,
            "late": stats.contributions_late,
            "applied": stats.commits_applied,
            "bytes_sent": stats.bytes_sent,
            "refused": refused,
            "left_at": left_at,
        }
    )
)
if role == "island":
    # A join rank 0 cannot make (the run's configuration differs): rank 0 raises why, the other rank stops too.
    try:
        sl.Session(model, algorithm=sl.DiLoCo(sync_every=5), mailbox=mailbox, island=dist.group.WORLD).start()
        failed = ""
    except sl.SlowlinkError as error:
        failed = type(error).__name__
    Path(out).write_text(json.dumps({**json.loads(Path(out).read_text()), "failed_join": failed}))
    dist.destroy_process_group()
