"""A merger keeps its own contribution in memory instead of writing it to its round, and writes it when it
stops merging: when another node takes the lead from it, and when it leaves with the round still open. In
both cases the next merger finds it and merges it."""

import json

import numpy as np

import slowlink as sl
from slowlink.algorithms.diloco import DiLoCo
from slowlink.mailbox.faulty import Faulty
from slowlink.protocol import keys

from .lockstep import LEASE, Ledger, Node, World, create_run


def turns(node: Node, count: int = 1) -> None:
    for _ in range(count):
        node.finish_turn()


def test_a_merger_that_loses_the_lead_writes_its_kept_contribution_and_the_next_merger_merges_it():
    algorithm = DiLoCo(sync_every=10, fragments=2, quorum_size=2, grace_seconds=None)
    ledger = Ledger()
    world = World(ledger, algorithm, create_run(ledger, algorithm))
    store = Faulty(ledger, after_write_share=0.5, error_rate=0.0, partial_rate=0.0, seed=0)
    world.nodes = [Node(node_id, store, world) for node_id in ("a", "b")]
    a, b = world.nodes
    try:
        turns(a, 3)  # joins, and leads: the run has no merger
        turns(b, 3)
        assert a.courier.leadership.is_leader and not b.courier.leadership.is_leader
        a.contribute(0, final=False)
        turns(a, 2)
        mine = keys.contribution(0, 1, "a")
        assert ("kept", mine) in [(verb, key) for verb, key, _ in ledger.writes]
        assert ledger.get(mine) is None  # kept in a's memory: the round's quorum of 2 is not in
        # a falls silent for a whole lease; b takes the lead over.
        b.clock.advance(LEASE)
        turns(b, 3)
        assert b.courier.leadership.is_leader
        a.clock.advance(LEASE / 4)  # a renews its lead, finds b's, and writes what it kept
        turns(a, 3)
        assert not a.courier.leadership.is_leader and ledger.get(mine) is not None
        assert a.courier.merger.own.kept == {}
        b.contribute(0, final=False)
        turns(b, 4)
        found = ledger.get(keys.commit(0, 1))
        assert found is not None
        commit = json.loads(found.data)
        assert commit["merger"] == "b"
        assert sorted(c["node"] for c in commit["contributors"]) == ["a", "b"]
    finally:
        for node in world.nodes:
            node.stop()


def test_a_merger_that_leaves_with_its_round_open_writes_its_contribution_for_the_next_merger(tmp_path):
    mailbox = sl.DirMailbox(tmp_path / "run")
    algorithm = sl.DiLoCo(sync_every=2, quorum_size=2)  # no barrier: node-0 can leave before node-1 steps
    torch = __import__("torch")
    torch.manual_seed(0)
    models = [torch.nn.Linear(4, 2) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    first = sl.Session(models[0], algorithm=algorithm, mailbox=mailbox, node_id="node-0", close_timeout=0.5,
                       lease_seconds=2)  # fmt: skip
    first.__enter__()  # creates the run and leads it
    second = sl.Session(models[1], algorithm=algorithm, mailbox=mailbox, node_id="node-1", close_timeout=20,
                        lease_seconds=2)  # fmt: skip
    second.__enter__()
    rng = np.random.default_rng(0)
    for model, session in ((models[0], first), (models[1], second)):
        for _ in range(2):  # one round's steps, so each contributes to round 1 of the one fragment
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.from_numpy(rng.normal(0, 0.01, tuple(p.shape)).astype(np.float32)))
            session.step(samples=4)
        if session is first:
            # node-0 leaves before node-1's contribution is in: the round stays open, and node-0's own
            # contribution, which it kept, must be written for whoever merges the round next
            session.__exit__(None, None, None)
            assert mailbox.get(keys.contribution(0, 1, "node-0")) is not None
    second.__exit__(None, None, None)
    commit = json.loads(mailbox.get(keys.commit(0, 1)).data)
    assert commit["merger"] == "node-1"
    assert sorted(c["node"] for c in commit["contributors"]) == ["node-0", "node-1"]
