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


def test_a_round_with_its_quorum_looks_for_the_others_soon_after_then_less_often_up_to_its_window_end():
    # sync_every=100 at 0.01 s a step: a grace window of half a sync, 0.5 s, from the quorum at t = 10.
    looks = Looks(sl.DiLoCo(sync_every=100).rounds(1))
    looks.look_seconds = 60.0  # no idle look in between
    open_rounds = {0: OpenRound(5, accepted={"me": {"step_seconds": 0.01}}, quorum_at=10.0)}
    looks.looked(10.0)  # the look that found the quorum
    seen = []
    now = 10.0
    while now < 11.0:
        due, next_look = looks.due(now, open_rounds, VERSIONS)
        if due:
            looks.looked(now)
            seen.append(round(now, 4))
        assert next_look > now or due
        now = round(now + 0.005, 4)
    # A node a step behind is found 62.5 ms after the quorum, not at the window's end (0.5 s): its round
    # closes then. Each look is due once, within SLACK (0.05 s) of its time.
    assert seen == [10.015, 10.075, 10.2, 10.45]  # the first turns (every 5 ms) within SLACK of each
    for at, look in zip(seen, (0.0625, 0.125, 0.25, 0.5), strict=True):
        assert 10.0 + look - 0.05 <= at <= 10.0 + look


def test_a_leaving_merger_looks_every_closing_seconds_after_the_quorum_then_as_before():
    # The node leaves and waits on this round: four looks 25 ms apart, then the grace window's own.
    looks = Looks(sl.DiLoCo(sync_every=100).rounds(1))
    looks.look_seconds, looks.closing = 60.0, True
    open_rounds = {0: OpenRound(5, accepted={"me": {"step_seconds": 0.01}}, quorum_at=10.0)}
    looks.looked(10.0)
    seen, now = [], 10.0
    while now < 10.3:
        due, _ = looks.due(now, open_rounds, VERSIONS)
        if due:
            looks.looked(now)
            seen.append(now)
        now = round(now + 0.005, 4)
    # 25, 50, 62.5 (the grace window's first), 75, 100, 125 and 250 ms after the quorum, each within half a
    # CLOSING_SECONDS of its time
    assert seen == [10.015, 10.04, 10.05, 10.065, 10.09, 10.115, 10.24]


def test_the_next_look_follows_a_quorum_the_last_look_found():
    # Before the look, no round had its quorum: the next look was the idle one, look_seconds on. The look
    # found it: the next is then the grace window's first, 62.5 ms after the quorum.
    looks = Looks(sl.DiLoCo(sync_every=100).rounds(1))
    looks.look_seconds = 60.0
    looks.looked(9.0)
    due, next_look = looks.due(10.0, {}, VERSIONS)
    assert not due and next_look == 69.0
    looks.looked(10.0)
    open_rounds = {0: OpenRound(5, accepted={"me": {"step_seconds": 0.01}}, quorum_at=10.0)}
    assert looks.next_look(10.01, open_rounds, VERSIONS) == 10.0625
