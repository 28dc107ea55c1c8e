"""Bad input to the simulator is refused before anything runs, with an error that names the thing and the fix."""

import pytest

import slowlink as sl
from slowlink import sim

from .common import data_for, mse, tiny_mlp

GOOD = dict(workers=2, steps=4, loss=mse)


@pytest.mark.parametrize(
    ("method", "options", "message"),
    [
        ("diloco", {}, "is not a slowlink method"),
        (sl.DiLoCo(sync_every=2), {"workers": 0}, "workers=0 must be a positive integer"),
        (sl.DiLoCo(sync_every=2), {"steps": 2.5}, "steps=2.5 must be a positive integer"),
        (sl.DiLoCo(sync_every=2), {"jitter": 1.0}, "jitter=1.0 must be in [0, 1)"),
        (sl.DiLoCo(sync_every=2), {"step_seconds": [1.0, 2.0, 3.0]}, "or one per worker (2)"),
        (sl.DiLoCo(sync_every=2), {"step_seconds": -1}, "must be a positive number of seconds"),
        (
            sl.DiLoCo(sync_every=2),
            {"network": sim.Network(latency=[0.1, 0.2, 0.3])},
            "lists 3 links for 2 workers",
        ),
    ],
)
def test_bad_input_names_the_option_and_the_fix(method, options, message):
    with pytest.raises(sl.ConfigError) as raised:
        sim.run(method, tiny_mlp, data_for(2, 4), **(GOOD | options))
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: sim.Network(bandwidth="fast"), "is not a bandwidth"),
        (lambda: sim.Network(bandwidth=0), "must be a positive bandwidth"),
        (lambda: sim.Network(latency=-1), "must be a duration in seconds ≥ 0"),
        (lambda: sim.Network(exchange="carrier pigeon"), "must be one of ('store', 'allreduce', 'pairwise')"),
        (lambda: sim.Store(request_latency="soon"), "is not a duration"),
    ],
)
def test_a_bad_network_is_refused_where_it_is_built(make, message):
    with pytest.raises(sl.ConfigError) as raised:
        make()
    assert message in str(raised.value)


def test_units_are_read_as_people_write_them():
    network = sim.Network(
        bandwidth="100Mbps", latency="30ms", store=sim.Store(request_latency="20ms", throughput="1Gbps")
    )
    assert network.link(0) == (1e8, 0.03)
    # A 1 MB PUT: 20 ms of request, 30 ms of link, 80 ms of bytes at 100 Mbps (the store's 1 Gbps is not the limit).
    assert network.upload_seconds(0, 1_000_000) == pytest.approx(0.13)
    assert network.allreduce_seconds([0, 1], 1_000_000) == pytest.approx(2 * 0.03 + 8e6 / 1e8)
    assert network.pairwise_seconds(0, 1, 1_000_000) == pytest.approx(0.03 + 0.08)


def test_a_method_of_rounds_is_refused_a_pairwise_network():
    with pytest.raises(sl.ConfigError, match="is the exchange of gossip methods"):
        sim.run(
            sl.DiLoCo(sync_every=2),
            tiny_mlp,
            data_for(2, 4),
            network=sim.Network(exchange="pairwise"),
            **GOOD,
        )


def test_the_callers_random_stream_is_left_as_it_was():
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    sim.run(sl.DiLoCo(sync_every=2), tiny_mlp, data_for(2, 4), **GOOD)
    assert torch.equal(torch.rand(3), expected)
