"""When a follower looks for the commit its contribution awaits (protocol/follow.py)."""

import math

import slowlink as sl
from slowlink.protocol.follow import LATENCY_SHARE, CommitFeed


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def feed_with_latency(latency: float, clock: Clock) -> CommitFeed:
    feed = CommitFeed(sl.MemoryMailbox(), None, "me", lambda event: None, {0: (0, {})}, [0], None, clock)
    feed.latencies.extend([latency] * 5)
    return feed


def test_after_a_miss_the_next_look_comes_a_quarter_latency_later_then_twice_as_long_each_time():
    # Left to the courier's backoff, a look that missed was followed a poll or more later, and the latency
    # it then measured kept the next rounds as slow (a barrier's rounds took 0.5 s where 0.25 s could do).
    clock = Clock()
    feed = feed_with_latency(0.4, clock)
    awaited = {0: "contribution"}
    assert feed.next_look_at(awaited) == math.inf  # nothing sent yet
    clock.now = 10.0
    feed.sent(0)
    assert math.isclose(feed.next_look_at(awaited), 10.0 + LATENCY_SHARE * 0.4)
    looks = []
    for _ in range(4):
        clock.now = feed.next_look_at(awaited)
        feed.catch_up(0, awaited=awaited)  # the commit is not there yet: a miss
        looks.append(round(clock.now - 10.0, 6))
    assert looks == [0.3, 0.4, 0.6, 1.0]
    clock.now = 11.5
    feed.sent(0)  # the next contribution starts afresh
    assert math.isclose(feed.next_look_at(awaited), 11.5 + LATENCY_SHARE * 0.4)


def test_a_tiny_latency_still_spaces_the_looks():
    clock = Clock()
    feed = feed_with_latency(0.001, clock)
    feed.sent(0)
    feed.catch_up(0, awaited={0: "contribution"})
    assert feed.next_look_at({0: "contribution"}) >= 0.02
