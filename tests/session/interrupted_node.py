"""A node for the Ctrl-C and node-id tests: leads a run under node id "a" over a DirMailbox whose every
request takes LATENCY seconds (0.4 by default), prints "leading" once it merges, then trains until
interrupted. Run as: python interrupted_node.py MAILBOX_PATH [LATENCY]."""

import itertools
import signal
import sys
import time

import torch

import slowlink as sl

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from nodes import batches, sgd_step, tiny_mlp  # noqa: E402


def main(path: str, latency: float) -> None:
    torch.set_num_threads(1)
    # Ctrl-C as in a terminal: a test run started in the background (`pytest ... &` in a script, as some CI
    # runners do) ignores SIGINT, its children inherit that, and this node would never hear the signals.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # With latency 0.4 s a request, leaving takes a while, long enough for a second Ctrl-C to land in it.
    mailbox = sl.mailbox.Faulty(sl.DirMailbox(path), latency=latency)
    model = tiny_mlp()
    with sl.Session(model, algorithm=sl.DiLoCo(sync_every=1), mailbox=mailbox, node_id="a",
                    poll_seconds=0.01, lease_seconds=60.0) as session:  # fmt: skip
        told = False
        for batch in itertools.cycle(batches(0, 50)):
            sgd_step(model, batch, 0.05)
            session.step(samples=4)
            if not told and session.stats.is_leader and session.stats.versions[0] >= 1:
                print("leading", flush=True)
                told = True
            time.sleep(0.01)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.4)
