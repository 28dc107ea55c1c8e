"""One node of the two-process tests: python gloo_node.py gloo|mailbox RANK PORT|FOLDER OUT.safetensors"""

import sys

import torch.distributed as dist
from safetensors.torch import save_file

from slowlink import DirMailbox
from slowlink.collective.mailbox import MailboxExchange
from tests.optim.nodes import train

how, rank, where, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if how == "gloo":
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{where}", rank=rank, world_size=2)
    save_file(train(rank, None), out)  # exchange=None: DeMo picks torch.distributed
    dist.destroy_process_group()
else:
    exchange = MailboxExchange(DirMailbox(where), rank=rank, nodes=2, deadline_seconds=120.0, keep_steps=2)
    save_file(train(rank, exchange), out)
    assert exchange.missed == [], exchange.missed
