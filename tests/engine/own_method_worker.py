"""One node of test_own_method's process test: trains tiny_mlp with ParameterAverage over a DirMailbox and
writes its final parameters to an .npz. Run as:
python own_method_worker.py MAILBOX_DIR NODE NODES EVERY STEPS LR OUT_NPZ (the repository root on PYTHONPATH)."""

import sys
import time

import numpy as np
import torch

import slowlink as sl
from tests.engine.test_own_method import ParameterAverage, parameters
from tests.session.nodes import batches, sgd_step, tiny_mlp


def main(directory: str, node: int, nodes: int, every: int, steps: int, lr: float, out: str) -> None:
    torch.set_num_threads(1)
    model, mailbox = tiny_mlp(), sl.DirMailbox(directory)
    with sl.Session(model, algorithm=ParameterAverage(every=every, nodes=nodes), mailbox=mailbox,
                    node_id=f"node-{node}", poll_seconds=0.01) as session:  # fmt: skip
        while len(mailbox.list("nodes/")) < nodes:
            time.sleep(0.01)  # no round may close before every node holds a lease
        for batch in batches(node, steps):
            sgd_step(model, batch, lr)
            session.step(samples=len(batch[0]))
    np.savez(out, **parameters(model))


if __name__ == "__main__":
    directory, node, nodes, every, steps, lr, out = sys.argv[1:]
    main(directory, int(node), int(nodes), int(every), int(steps), float(lr), out)
