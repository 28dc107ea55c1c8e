"""DeMo's exchanges one at a time: the mailbox's deadline (a missing node is counted, the step goes on with
what arrived), its refusal of oversized payloads, and the simulator's timing and byte counts."""

import pytest
import torch

import slowlink as sl
from slowlink import sim
from slowlink.clock import VirtualClock
from slowlink.collective.mailbox import MailboxExchange
from slowlink.engine.exchange import SingleNode
from tests.optim.nodes import LR, OPTIONS, batch, model, mse, train


class Counting(sl.MemoryMailbox):
    def __init__(self) -> None:
        super().__init__()
        self.verbs: list[str] = []

    def get(self, key, **options):
        self.verbs.append("get")
        return super().get(key, **options)

    def list(self, prefix, **options):
        self.verbs.append("list")
        return super().list(prefix, **options)


def test_a_node_missing_its_deadline_is_counted_and_the_step_goes_on_with_what_arrived():
    store, clock = Counting(), VirtualClock()
    exchange = MailboxExchange(store, rank=0, nodes=3, deadline_seconds=5.0, poll_seconds=0.5, clock=clock)
    store.put(exchange.key(0, 2), b"from node 2")  # node 2 is in time; node 1 never comes
    rows = exchange.all_gather(b"from node 0", step=0, max_bytes=100)
    assert rows == [b"from node 0", None, b"from node 2"]
    assert exchange.missed == [(0, [1])] and clock.now() == pytest.approx(5.0)
    assert "list" not in store.verbs  # every poll is a GET by key
    # a DeMo node whose peers never come steps alone: as one node would
    alone = train(0, MailboxExchange(sl.MemoryMailbox(), rank=0, nodes=2, deadline_seconds=1.0,
                                     clock=VirtualClock()))  # fmt: skip
    reference = train(0, SingleNode())
    assert all(torch.equal(alone[name], reference[name]) for name in reference)


def test_a_payload_larger_than_any_node_can_send_is_never_read():
    store = sl.MemoryMailbox()
    exchange = MailboxExchange(store, rank=0, nodes=2, deadline_seconds=1.0, clock=VirtualClock())
    store.put(exchange.key(3, 1), b"x" * 1000)
    assert exchange.all_gather(b"mine", step=3, max_bytes=100) == [b"mine", None]
    assert [(step, rank) for step, rank, _ in exchange.oversized][:1] == [(3, 1)]


@pytest.mark.parametrize("options, words", [({"rank": 2}, "rank=2"), ({"deadline_seconds": 0}, "deadline_seconds=0"),
                                            ({"nodes": 0}, "nodes=0")])  # fmt: skip
def test_bad_mailbox_exchange_options_are_refused_naming_them(options, words):
    with pytest.raises(sl.ConfigError, match=words):
        MailboxExchange(sl.MemoryMailbox(), **{"rank": 0, "nodes": 2, **options})


def test_the_simulator_waits_for_the_slowest_worker_and_its_network():
    network = sim.Network(bandwidth=8e6, latency=0.01, exchange="allreduce")  # 1 MB/s
    result = sim.run_demo(model, batch, workers=3, steps=2, lr=LR, loss=mse, step_seconds=[1.0, 1.0, 2.0],
                          network=network, **OPTIONS)  # fmt: skip
    size = result.bytes_per_step[0]
    step = 2.0 + 2 * (0.01 + size / 1e6)  # the slowest worker's compute, then a ring of 2 hops of a payload
    assert result.wall_seconds == pytest.approx(2 * step)
    assert result.workers[0].stalled_seconds == pytest.approx(2 * (step - 1.0))
    assert result.workers[2].compute_seconds == 4.0
    reports = result.workers  # each receives the other two's payloads
    assert sum(r.bytes_received for r in reports) == 2 * sum(r.bytes_sent for r in reports) > 0
    with pytest.raises(sl.ConfigError, match="exchange"):
        sim.run_demo(model, batch, steps=1, lr=LR, exchange=SingleNode())
