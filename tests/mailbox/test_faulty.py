"""Faulty: injected faults come at the rates asked, repeat for a seed, and are each counted exactly once.

Faulty also runs the whole contract suite with no faults (the "faulty" kind in conftest.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from slowlink.errors import ConfigError, MailboxUnavailable
from slowlink.mailbox import MemoryMailbox
from slowlink.mailbox.faulty import Faulty

N = 3000


class Sleeps(list):
    """A stand-in for time.sleep that records how long each sleep would have been."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def put_then_get_everything(mailbox: Faulty, keys: list[str]) -> tuple[dict, dict]:
    """Put each key (its data is the key repeated), then get it; return what each put and get did."""
    puts, gets = {}, {}
    for key in keys:
        try:
            puts[key] = mailbox.put(key, key.encode() * 10)
        except MailboxUnavailable as error:
            puts[key] = error
    for key in keys:
        try:
            gets[key] = mailbox.get(key)
        except MailboxUnavailable as error:
            gets[key] = error
    return puts, gets


def test_faults_come_at_close_to_the_rates_asked_for_a_fixed_seed():
    inner = MemoryMailbox()
    mailbox = Faulty(inner, error_rate=0.1, timeout_rate=0.05, partial_rate=0.2, seed=7, sleep=Sleeps())
    keys = [f"k/{n:05d}" for n in range(N)]
    puts, gets = put_then_get_everything(mailbox, keys)
    failed_puts = sum(isinstance(outcome, MailboxUnavailable) for outcome in puts.values())
    failed_gets = sum(isinstance(outcome, MailboxUnavailable) for outcome in gets.values())
    assert abs(failed_puts / N - 0.15) < 0.02
    assert abs(failed_gets / N - 0.15) < 0.02
    after_write = mailbox.faults["error_after_write"] + mailbox.faults["timeout_after_write"]
    assert abs(after_write / failed_puts - 0.5) < 0.08  # after_write_share's default
    assert (
        abs(mailbox.faults["timeout"] + mailbox.faults["timeout_after_write"] - 0.05 * 2 * N) < 0.02 * 2 * N
    )
    answered = [got for got in gets.values() if got is not None and not isinstance(got, MailboxUnavailable)]
    assert abs(mailbox.faults["partial"] / len(answered) - 0.2) < 0.03


def test_every_injected_fault_is_counted_exactly_once_and_leaves_the_store_as_it_says():
    inner = MemoryMailbox()
    mailbox = Faulty(inner, error_rate=0.15, timeout_rate=0.1, partial_rate=0.25, seed=3, sleep=Sleeps())
    keys = [f"k/{n:05d}" for n in range(N)]
    puts, gets = put_then_get_everything(mailbox, keys)
    raised = [o for o in [*puts.values(), *gets.values()] if isinstance(o, MailboxUnavailable)]
    assert len(raised) == sum(
        mailbox.faults[k] for k in ("error", "error_after_write", "timeout", "timeout_after_write")
    )
    # A put that failed "after write" was applied; one that failed before was not.
    failed = [key for key, outcome in puts.items() if isinstance(outcome, MailboxUnavailable)]
    applied = [key for key in failed if inner.get(key) is not None]
    assert len(applied) == mailbox.faults["error_after_write"] + mailbox.faults["timeout_after_write"]
    assert all("answer was lost" in str(puts[key]) for key in applied)
    # A partial answer is a strict prefix of the stored bytes, with the stored etag.
    cut = []
    for key, got in gets.items():
        if isinstance(got, MailboxUnavailable) or got is None:
            continue
        stored = inner.get(key)
        assert got.etag == stored.etag and stored.data.startswith(got.data)
        if len(got.data) < len(stored.data):
            cut.append(key)
    assert len(cut) == mailbox.faults["partial"] > 0
    assert mailbox.requests == {"PUT": N, "GET": N}


def outcomes(mailbox: Faulty, keys: list[str]) -> dict[str, tuple[str, str]]:
    """For each key: how its put went and what its get returned (etags left out: they count writes)."""
    puts, gets = put_then_get_everything(mailbox, keys)

    def describe(outcome: object) -> str:
        if isinstance(outcome, Exception):
            return f"{type(outcome).__name__}: {outcome}"
        return repr(getattr(outcome, "data", "ok"))

    return {key: (describe(puts[key]), describe(gets[key])) for key in keys}


def test_the_same_seed_injects_the_same_faults_and_another_seed_others():
    keys = [f"k/{n}" for n in range(300)]

    def run(seed: int) -> dict[str, tuple[str, str]]:
        return outcomes(Faulty(MemoryMailbox(), error_rate=0.2, partial_rate=0.2, seed=seed), keys)

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_faults_do_not_depend_on_how_threads_interleave():
    keys = [f"k/{n}" for n in range(400)]
    options = dict(error_rate=0.2, timeout_rate=0.1, partial_rate=0.2, seed=5, sleep=Sleeps())
    alone = Faulty(MemoryMailbox(), **options)
    sequential = outcomes(alone, keys)
    threaded = Faulty(MemoryMailbox(), **options)
    with ThreadPoolExecutor(4) as pool:
        shares = list(pool.map(lambda i: outcomes(threaded, keys[i::4]), range(4)))
    assert {key: outcome for share in shares for key, outcome in share.items()} == sequential
    assert threaded.faults == alone.faults


def test_latency_and_timeouts_sleep_exactly_as_configured():
    sleeps = Sleeps()
    mailbox = Faulty(MemoryMailbox(), latency=0.01, jitter=0.004, timeout_rate=0.1, timeout=2.5, sleep=sleeps)
    for n in range(500):
        try:
            mailbox.put(f"k{n}", b"x")
        except MailboxUnavailable:
            pass
    timeouts = mailbox.faults["timeout"] + mailbox.faults["timeout_after_write"]
    assert sleeps.count(2.5) == timeouts > 0
    latencies = [s for s in sleeps if s != 2.5]
    assert len(latencies) == 500 and all(0.01 <= s <= 0.014 for s in latencies)


def test_only_the_named_verbs_see_faults():
    mailbox = Faulty(MemoryMailbox(), error_rate=1.0, verbs=("put",), after_write_share=0.0)
    with pytest.raises(MailboxUnavailable, match="injected failure .*PUT k failed before reaching the store"):
        mailbox.put("k", b"x")
    assert mailbox.get("k") is None and mailbox.list("") == []
    mailbox.delete(["k"])
    assert mailbox.faults == {"error": 1}


def test_a_write_can_fail_after_it_was_applied():
    inner = MemoryMailbox()
    mailbox = Faulty(inner, error_rate=1.0, after_write_share=1.0)
    with pytest.raises(MailboxUnavailable, match="after the store applied it"):
        mailbox.put("k", b"x", if_absent=True)
    assert inner.get("k").data == b"x"
    assert mailbox.faults == {"error_after_write": 1}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"error_rate": 1.5}, "error_rate=1.5"),
        ({"partial_rate": -0.1}, "partial_rate=-0.1"),
        ({"error_rate": 0.6, "timeout_rate": 0.6}, "add up to more than 1"),
        ({"latency": -1}, "latency=-1"),
        ({"verbs": ("put", "head")}, "['head']"),
    ],
)
def test_bad_options_are_rejected_naming_them(options, named):
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        Faulty(MemoryMailbox(), **options)


def test_users_reach_it_as_sl_mailbox_faulty_to_rehearse_a_run():
    import slowlink as sl

    rehearsal = sl.mailbox.Faulty(sl.MemoryMailbox(), error_rate=1.0, seed=3)
    with pytest.raises(sl.MailboxError):
        rehearsal.put("a", b"x")
    assert rehearsal.faults["error"] + rehearsal.faults["error_after_write"] == 1
