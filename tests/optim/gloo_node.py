"""One node of the two-process gloo test: python gloo_node.py RANK PORT OUT.safetensors"""

import sys

import torch.distributed as dist
from safetensors.torch import save_file

from tests.optim.nodes import train

rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
save_file(train(rank, None, values="2bit"), out)  # exchange=None: DeMo picks torch.distributed
dist.destroy_process_group()
