"""One rank of the process-group test: python allreduce_node.py RANK PORT OUT.safetensors

DiLoCo over sl.collective.AllReduce (float32), then the quantized all-reduce's error on 1-D, 2-D and 4-D
tensors against its bound, and a run with 8-bit rounds whose ranks must agree.
"""

import json
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file

import slowlink as sl
from slowlink.collective.quantized import error_bound, quantized_all_reduce
from tests.collective.diloco_nodes import train

rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
params, stats = train(rank, mailbox=sl.collective.AllReduce())
save_file(params, out)
errors = {}
for bits in (8, 4):
    for shape in [(1000,), (37, 23), (3, 4, 5, 7)]:
        generator = torch.Generator().manual_seed(7)
        mine = [
            torch.randn(shape, generator=generator) * (r + 1) for r in range(2)
        ]  # each rank's, known to both
        got = quantized_all_reduce(mine[rank], bits)
        error = (got - (mine[0] + mine[1])).abs()
        bound = error_bound(mine, bits)
        errors[f"{bits}:{len(shape)}"] = [
            float((error / bound).max()),
            float(error.max()),
            float(bound.max()),
        ]
quantized, _ = train(rank, mailbox=sl.collective.AllReduce(bits=8))
save_file(quantized, out.replace(".safetensors", "-8bit.safetensors"))
# FSDP2's sharded parameters over AllReduce: refused on every rank, naming the tensor and the island instead.
from torch.distributed.fsdp import fully_shard  # noqa: E402

try:
    sl.Session(
        fully_shard(torch.nn.Linear(4, 4)),
        algorithm=sl.DiLoCo(sync_every=2),
        mailbox=sl.collective.AllReduce(),
    ).start()
    refused = ""
except sl.ConfigError as error:
    refused = str(error)
with open(out.replace(".safetensors", ".json"), "w") as file:
    json.dump(
        {
            "errors": errors,
            "sent": stats.contributions_sent,
            "applied": stats.commits_applied,
            "bytes_sent": stats.bytes_sent,
            "refused": refused,
        },
        file,
    )
dist.destroy_process_group()
