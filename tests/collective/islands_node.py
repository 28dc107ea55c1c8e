"""One process of the island test: python islands_node.py ROLE RANK PORT DIR

ROLE "island": rank RANK of a 2-rank gloo island; ROLE "single": a plain node. The same processes run the DDP
island's run (island_node.py), then the FSDP2 island's (fsdp_node.py), each on its own DirMailbox under DIR:
torch's imports, most of the test's time, are paid once for both.
"""

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tests.collective import fsdp_node, island_node


def enter_together(folder: Path, role: str, rank: int) -> None:
    """All three processes start a run together (imports take long on a busy machine): a node alone would
    commit by itself."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"ready-{role}{rank}").touch()
    deadline = (
        time.monotonic() + 240
    )  # a process that died before it: fail, do not wait for the test's timeout
    while len(list(folder.glob("ready-*"))) < 3:
        if time.monotonic() > deadline:
            raise SystemExit(f"{role} {rank}: the other processes never reached {folder.name}")
        time.sleep(0.02)


if __name__ == "__main__":
    role, rank, port, where = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    torch.set_num_threads(1)
    if role == "island":
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    enter_together(where / "ddp", role, rank)
    island_node.run(role, rank, where / "ddp" / "run", where / f"ddp-{role}{rank}.json")
    enter_together(where / "fsdp", role, rank)
    fsdp_node.run(role, rank, where / "fsdp" / "run", where / f"fsdp-{role}{rank}.json")
    if role == "island":
        dist.destroy_process_group()
