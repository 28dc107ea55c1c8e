"""DiLoCo pinned to its definition: with H = 1 it is synchronous data-parallel SGD, with H > 1 parameter
averaging every H steps (outer lr 1, no momentum, quorum = every node, no overlap)."""

import copy
import threading
import time

import pytest
import torch

import slowlink as sl

from .nodes import batches, run_nodes, sgd_step, tiny_mlp


def exact(sync_every: int, nodes: int, **options) -> sl.DiLoCo:
    return sl.DiLoCo(
        sync_every=sync_every, outer_lr=1.0, outer_momentum=0.0, quorum_size=nodes, overlap_steps=0, **options
    )


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("nodes", [2, 3])
def test_h1_equals_synchronous_data_parallel_sgd_on_the_concatenated_batches(nodes):
    steps, lr = 8, 0.1
    models, _ = run_nodes(nodes, exact(1, nodes), sl.MemoryMailbox(), steps, lr=lr)
    reference = tiny_mlp()
    node_batches = [batches(i, steps) for i in range(nodes)]
    for t in range(steps):
        x = torch.cat([node_batches[i][t][0] for i in range(nodes)])
        y = torch.cat([node_batches[i][t][1] for i in range(nodes)])
        sgd_step(reference, (x, y), lr)
    for model in models:
        torch.testing.assert_close(flat(model), flat(reference), atol=1e-6, rtol=0)
    assert not torch.equal(flat(reference), flat(tiny_mlp()))  # it did train


def test_h_greater_than_one_equals_parameter_averaging_every_h_steps():
    nodes, steps, sync_every, lr = 2, 12, 4, 0.1
    models, stats = run_nodes(nodes, exact(sync_every, nodes), sl.MemoryMailbox(), steps, lr=lr)
    average = tiny_mlp()
    node_batches = [batches(i, steps) for i in range(nodes)]
    for start in range(0, steps, sync_every):
        replicas = [copy.deepcopy(average) for _ in range(nodes)]
        for i, replica in enumerate(replicas):
            for t in range(start, start + sync_every):
                sgd_step(replica, node_batches[i][t], lr)
        with torch.no_grad():
            for p, *qs in zip(average.parameters(), *(r.parameters() for r in replicas), strict=True):
                p.copy_(torch.stack(qs).mean(dim=0))
    for model in models:
        torch.testing.assert_close(flat(model), flat(average), atol=1e-6, rtol=0)
    assert [s.commits_applied for s in stats] == [steps // sync_every] * nodes
    assert sum(s.rounds_merged for s in stats) == steps // sync_every


def test_with_momentum_each_commit_follows_outer_nesterov_from_the_averaged_delta():
    # Two nodes, H = 2, η = 0.7, μ = 0.9: replay the rounds with the pure outer step and compare.
    nodes, steps, sync_every, lr = 2, 6, 2, 0.1
    algorithm = sl.DiLoCo(sync_every=sync_every, quorum_size=nodes, overlap_steps=0)
    models, _ = run_nodes(nodes, algorithm, sl.MemoryMailbox(), steps, lr=lr)
    theta, buffer = flat(tiny_mlp()), None
    node_batches = [batches(i, steps) for i in range(nodes)]
    for start in range(0, steps, sync_every):
        deltas = []
        for i in range(nodes):
            replica = tiny_mlp()
            torch.nn.utils.vector_to_parameters(theta.clone(), replica.parameters())
            for t in range(start, start + sync_every):
                sgd_step(replica, node_batches[i][t], lr)
            deltas.append(theta - flat(replica))
        delta = torch.stack(deltas).mean(dim=0)
        buffer = delta if buffer is None else 0.9 * buffer + delta
        theta = theta - 0.7 * (delta + 0.9 * buffer)
    for model in models:
        torch.testing.assert_close(flat(model), theta, atol=1e-5, rtol=0)


def test_a_barrier_round_waits_for_a_node_whose_lease_the_merger_has_not_read_yet():
    """Standard DiLoCo from its first round: the second node enters its Session 1.5 s after the first, whose
    merger has by then read the leases and seen only its own. "Every live node has reported" must not close
    a barrier round short of its quorum on that view (it did: round 1 committed node-0 alone)."""
    nodes, steps, sync_every, lr = 2, 8, 4, 0.1
    mailbox, models = sl.MemoryMailbox(), [tiny_mlp() for _ in range(nodes)]
    stats, errors = [None] * nodes, []

    def node(i: int) -> None:
        try:
            time.sleep(1.5 * i)
            with sl.Session(models[i], algorithm=exact(sync_every, nodes), mailbox=mailbox, node_id=f"node-{i}",
                            poll_seconds=0.005) as session:  # fmt: skip
                for batch in batches(i, steps):
                    sgd_step(models[i], batch, lr)
                    session.step(samples=len(batch[0]))
            stats[i] = session.stats
        except BaseException as error:  # raised below
            errors.append(error)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    average = tiny_mlp()
    node_batches = [batches(i, steps) for i in range(nodes)]
    for start in range(0, steps, sync_every):
        replicas = [copy.deepcopy(average) for _ in range(nodes)]
        for i, replica in enumerate(replicas):
            for t in range(start, start + sync_every):
                sgd_step(replica, node_batches[i][t], lr)
        with torch.no_grad():
            for p, *qs in zip(average.parameters(), *(r.parameters() for r in replicas), strict=True):
                p.copy_(torch.stack(qs).mean(dim=0))
    for model in models:
        torch.testing.assert_close(flat(model), flat(average), atol=1e-6, rtol=0)
    assert [s.commits_applied for s in stats] == [steps // sync_every] * nodes
