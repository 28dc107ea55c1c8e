"""One node of the light-commit tests: a 1.1M-parameter MLP learning a fixed random function, in a Session over
an S3 bucket; writes its traffic and the held-out loss of the model it ends on as JSON.
Run as: python light_worker.py ARGS_JSON OUT_JSON."""

import json
import sys
import time

import torch

import slowlink as sl

WIDTH, INPUTS = 1024, 64


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(INPUTS, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH),
                               torch.nn.Tanh(), torch.nn.Linear(WIDTH, 1))  # fmt: skip


def teacher() -> torch.nn.Module:
    """The function to learn: a small random network, so that the loss falls steadily over the run."""
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(INPUTS, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


TEACHER = teacher()


def batch(generator: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(size, INPUTS, generator=generator)
    with torch.no_grad():
        return x, TEACHER(x)


def main(args: dict, out_path: str) -> None:
    torch.set_num_threads(1)
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    s3 = args["s3"]
    mailbox = sl.S3Mailbox(s3["bucket"], s3["prefix"], endpoint_url=s3["url"], region=s3["region"])
    generator = torch.Generator().manual_seed(100 + args["node"])
    with sl.Session(net, algorithm=sl.DiLoCo(**args["algorithm"]), mailbox=mailbox, node_id=f"node-{args['node']}",
                    compression=args.get("compression"), poll_seconds=0.02) as session:  # fmt: skip
        while len(mailbox.list("nodes/")) < 2:
            time.sleep(0.05)  # every round waits for both nodes: no round may close before both hold a lease
        for _ in range(args["steps"]):
            x, y = batch(generator, 32)
            loss = ((net(x) - y) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            session.step(samples=32)
    stats = session.stats
    with torch.no_grad():
        x, y = batch(torch.Generator().manual_seed(999), 2048)
        held_out = float(((net(x) - y) ** 2).mean())
    result = {"bytes_sent": stats.bytes_sent, "bytes_received": stats.bytes_received, "requests": stats.requests,
              "rounds_merged": stats.rounds_merged, "commits_applied": stats.commits_applied, "held_out": held_out}  # fmt: skip
    with open(out_path, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
