"""Gossip over a mailbox (protocol/peers.py, protocol/gossip.py): each node PUTs its values under its own key
and its partners GET them by name; a payload that is missing, late, corrupt or of another schema is handed
back as a reason, and the node mixes with itself, says so, and trains on."""

import threading

import numpy as np
import pytest
import torch

import slowlink as sl
from slowlink.mailbox.metered import Metered
from slowlink.protocol.peers import MailboxPeers, claim_rank, values_key
from slowlink.protocol.run import Run
from slowlink.wire import payload

RUN = Run("run-1", {}, [("w", (3,), "float32")], "digest-1", [["w"]], [])


def peers(mailbox, rank: int) -> MailboxPeers:
    exchange = MailboxPeers(
        mailbox, RUN, rank, 2, node_id=f"node-{rank}", emit=lambda event: None, poll_seconds=0.005
    )
    exchange.start()
    return exchange


def test_a_partners_values_arrive_and_bad_ones_come_back_as_reasons():
    mailbox = Metered(sl.MemoryMailbox())
    mine, theirs = peers(mailbox, 0), peers(mailbox, 1)
    try:
        clock = mine.clock
        theirs.publish(0, "delta", (0, 1), {"w": np.arange(3, dtype=np.float32)})
        mine.publish(0, "delta", (0, 1), {"w": np.zeros(3, np.float32)})
        got = mine.collect(0, "delta", (0, 1), clock.now() + 10)
        assert np.array_equal(got[1]["w"], [0, 1, 2])
        mailbox.put(values_key(1, "delta", 1), b"\x00junk that is no payload")
        mine.publish(1, "delta", (0, 1), {"w": np.zeros(3, np.float32)})
        assert mine.collect(1, "delta", (0, 1), clock.now() + 10)[1].startswith("corrupt: ")
        other = payload.pack({"w": np.zeros(4, np.float32)}, {"run": "run-1", "schema": "digest-1", "kind": "gossip",
                                                               "round": 2, "carries": "delta", "rank": 1})  # fmt: skip
        mailbox.put(values_key(2, "delta", 1), other)
        mine.publish(2, "delta", (0, 1), {"w": np.zeros(3, np.float32)})
        assert mine.collect(2, "delta", (0, 1), clock.now() + 10)[1].startswith("schema: ")
        mine.publish(3, "delta", (0, 1), {"w": np.zeros(3, np.float32)})
        assert mine.collect(3, "delta", (0, 1), clock.now() + 0.05) == {1: "late"}
        assert (
            mailbox.requests["LIST"] == 0 and mailbox.requests["GET"] > 0
        )  # partners' keys are read by name, never listed
    finally:
        mine.stop()
        theirs.stop()


def test_ranks_are_claimed_once_and_a_restart_gets_its_own_back():
    mailbox = sl.MemoryMailbox()
    assert [claim_rank(mailbox, name, 2) for name in ("a", "b", "a")] == [0, 1, 0]
    with pytest.raises(sl.ConfigError, match="nodes=2 ranks, all held"):
        claim_rank(mailbox, "c", 2)


def test_a_node_whose_partner_sends_a_corrupt_delta_mixes_mix2_with_itself_and_mix1_with_its_partner():
    # Two nodes, GlobalM1LocalM2 (both mixes are the pair): rank 1 is played by hand. Its start arrives
    # whole; its Δ is junk. Node 0 ends on y − η·Δ_0 (lr 1, no momentum), y the mean of the two starts.
    mailbox, events = sl.MemoryMailbox(), []
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    method = sl.GossipDiLoCo(sync_every=2, variant="GlobalM1LocalM2", nodes=2, outer_lr=1.0, outer_momentum=0.0,
                             mix2_seconds=5.0)  # fmt: skip
    start = {name: p.detach().numpy().copy() for name, p in model.named_parameters()}
    with sl.Session(model, algorithm=method, mailbox=mailbox, node_id="node-0", on_event=events.append,
                    poll_seconds=0.005) as session:  # fmt: skip
        run = session.peers.run
        header = {"run": run.run_id, "schema": run.schema_digest, "kind": "gossip", "round": 0, "rank": 1}
        partner = {name: values + 1.0 for name, values in start.items()}
        mailbox.put(values_key(0, "start", 1), payload.pack(partner, header | {"carries": "start"}))
        mailbox.put(values_key(0, "delta", 1), b"not a payload")
        with torch.no_grad():
            trained = {name: values - 0.25 for name, values in start.items()}
            session.step()
            model.weight -= 0.25
            model.bias -= 0.25
            session.step()
        stats, metrics = session.stats, session.metrics()
    assert metrics["rounds"] == 1 and metrics["self_mixed"] == 1 and metrics["partner_distance"] > 0
    for name, p in model.named_parameters():
        expected = (start[name] + partner[name]) / 2 - (start[name] - trained[name])
        np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-6)
    assert stats.self_mixed == {"corrupt": 1} and stats.rounds == 1 and stats.mix1_stall_seconds == 0.0
    assert [e.data["reason"].split(":")[0] for e in events if e.kind == "self_mixed"] == ["corrupt"]


def test_a_gossip_session_needs_its_rosters_size_and_a_node_id():
    model = torch.nn.Linear(2, 1)
    with pytest.raises(sl.ConfigError, match="nodes=4"):
        sl.Session(model, algorithm=sl.GossipDiLoCo(sync_every=2), mailbox=sl.MemoryMailbox(), node_id="a")
    with pytest.raises(sl.ConfigError, match="node_id"):
        sl.Session(model, algorithm=sl.NoLoCo(sync_every=2, nodes=2), mailbox=sl.MemoryMailbox())
    with pytest.raises(sl.ConfigError, match="run_key= is not available"):  # never silently unsigned
        sl.Session(model, algorithm=sl.NoLoCo(sync_every=2, nodes=2), mailbox=sl.MemoryMailbox(), node_id="a",
                   run_key="secret")  # fmt: skip


def test_the_simulators_two_entry_points_name_each_other():
    from slowlink import sim

    with pytest.raises(sl.ConfigError, match="run_gossip"):
        sim.run(sl.GossipDiLoCo(sync_every=2), torch.nn.Linear(2, 1), lambda w, s: None, workers=2, steps=2)
    with pytest.raises(sl.ConfigError, match="sim.run"):
        sim.run_gossip(sl.DiLoCo(sync_every=2), torch.nn.Linear(2, 1), lambda w, s: None, workers=2, steps=2)


def test_waiting_for_a_partner_that_is_still_training_costs_few_requests():
    # A partner's key that does not come: the communication thread backs off (1.25× a quiet turn, up to 1 s),
    # where polling every 5 ms would GET it some 300 times in 1.5 s.
    mailbox = Metered(sl.MemoryMailbox())
    mine = peers(mailbox, 0)
    try:
        mine.publish(0, "start", (0, 1), {"w": np.zeros(3, np.float32)})
        threading.Event().wait(1.5)
    finally:
        mine.stop()
    assert 1 <= mailbox.kinds["GET gossip/"] <= 40
