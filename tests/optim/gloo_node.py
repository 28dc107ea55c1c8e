"""One node of the two-process test, run twice: over torch.distributed (gloo), then over a DirMailbox.

python gloo_node.py RANK PORT FOLDER OUT_PREFIX      writes OUT_PREFIX{gloo,mailbox}.safetensors
"""

import sys

import torch.distributed as dist
from safetensors.torch import save_file

from slowlink import DirMailbox
from slowlink.collective.mailbox import MailboxExchange
from tests.optim.nodes import train

rank, port, folder, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
save_file(train(rank, None), f"{out}gloo.safetensors")  # exchange=None: DeMo picks torch.distributed
dist.destroy_process_group()
exchange = MailboxExchange(DirMailbox(folder), rank=rank, nodes=2, deadline_seconds=120.0, keep_steps=2)
save_file(train(rank, exchange), f"{out}mailbox.safetensors")
assert exchange.missed == [], exchange.missed
