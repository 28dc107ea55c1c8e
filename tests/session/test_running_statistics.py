"""BatchNorm's running statistics move with the data's scale, not with training: on inputs far from zero
mean and unit variance, a first round moves running_mean and running_var many times more than the whole
fragment's norm. They are merged like parameters, but the norm checks that guard against absurd
contributions judge the trainable tensors only, so an honest first round is not rejected."""

import threading

import torch

import slowlink as sl
from slowlink.protocol.run import read_commit, read_run
from tests.session.nodes import SEEDED_INIT


def batchnorm_model() -> torch.nn.Module:
    with SEEDED_INIT:  # built in the nodes' threads
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
        )


def test_running_statistics_far_from_their_start_do_not_get_an_honest_first_round_rejected(tmp_path):
    mailbox = sl.DirMailbox(tmp_path / "run")
    algorithm = sl.DiLoCo(sync_every=4, quorum_size=2, overlap_steps=0)
    stats, errors, barrier = [None, None], [], threading.Barrier(2)

    def node(i: int) -> None:
        try:
            model, generator = batchnorm_model(), torch.Generator().manual_seed(10 + i)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id=f"node-{i}",
                            poll_seconds=0.005) as session:  # fmt: skip
                barrier.wait()
                for _ in range(12):
                    x = 20 + 5 * torch.randn(16, 4, generator=generator)  # far from mean 0, variance 1
                    loss = (model(x).squeeze(1) - x[:, 0] / 20).pow(2).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    session.step(samples=16)
            stats[i] = session.stats
        except BaseException as error:
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    run = read_run(mailbox)
    assert run.statistics == ["1.running_mean", "1.running_var"]  # run.json names them
    first = read_commit(mailbox, 0, 1)
    assert first["rejected"] == [] and len(first["contributors"]) == 2
    assert all(s.contributions_rejected == 0 and s.commits_applied == 3 for s in stats)
