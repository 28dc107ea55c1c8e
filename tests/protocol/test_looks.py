"""When the merger reads contributions by key and when it lists rounds/ (protocol/looks.py)."""

import slowlink as sl
from slowlink.protocol.looks import Looks
from slowlink.protocol.merger import OpenRound

VERSIONS = {0: (4, None)}  # fragment 0's newest commit is 4: round 5 is open


def looks_after_a_listing() -> Looks:
    looks = Looks(sl.DiLoCo(sync_every=2).rounds(1))
    assert looks.probes(0.0, {}, VERSIONS, {(0, 5)}, {"peer"}, "me") is None  # round 5 not listed yet
    return looks


def test_a_listed_round_awaiting_one_leased_peer_reads_it_by_key():
    looks = looks_after_a_listing()
    open_rounds = {0: OpenRound(5, accepted={"me": {}})}
    assert looks.probes(1.0, open_rounds, VERSIONS, {(0, 5)}, {"peer"}, "me") == [(0, 5, "peer")]


def test_a_round_holding_a_contribution_from_outside_the_leases_is_listed_again():
    # A writer without a lease was caught by the first listing while it wrote: what it wrote after that
    # listing only another listing finds, and the commit must name it.
    looks = looks_after_a_listing()
    open_rounds = {0: OpenRound(5, accepted={"me": {}}, rejected={"stranger": "bad payload"})}
    assert looks.probes(1.0, open_rounds, VERSIONS, {(0, 5)}, {"peer"}, "me") is None
    assert looks.probes(1.5, open_rounds, VERSIONS, {(0, 5)}, {"peer", "stranger"}, "me") == [(0, 5, "peer")]
