"""The storage contract, one suite for every mailbox: memory, directory, and S3 (moto's server on 127.0.0.1).

Each test runs once per kind through the `mailbox` fixture in conftest.py. A test that only makes sense for
one kind (processes racing on a directory) says so in its name.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slowlink.errors import ConfigError, ObjectTooLarge, PayloadError, PreconditionFailed
from slowlink.mailbox import DirMailbox, Listing, Object, limits


def race(threads: int, action: Callable[[int], str]) -> dict[int, str | None]:
    """Start `action(i)` on every thread at once; map each i to what it returned, or None if it lost."""
    barrier = threading.Barrier(threads)

    def run(index: int) -> str | None:
        barrier.wait()
        try:
            return action(index)
        except PreconditionFailed:
            return None

    with ThreadPoolExecutor(threads) as pool:
        return dict(enumerate(pool.map(run, range(threads))))


# -- reading and writing ---------------------------------------------------------------------------


def test_a_written_object_reads_back_with_the_etag_put_returned(mailbox):
    etag = mailbox.put("runs/a.json", b'{"x": 1}')
    assert isinstance(etag, str) and etag and '"' not in etag
    assert mailbox.get("runs/a.json") == Object(b'{"x": 1}', etag)


def test_an_absent_key_reads_as_none_even_with_an_etag_to_match(mailbox):
    assert mailbox.get("nothing/here") is None
    assert mailbox.get("nothing/here", if_none_match="abc") is None


def test_overwriting_replaces_the_bytes_and_changes_the_etag(mailbox):
    first = mailbox.put("k", b"one")
    second = mailbox.put("k", b"two")
    assert second != first
    assert mailbox.get("k") == Object(b"two", second)


def test_every_write_of_new_bytes_gets_an_etag_never_seen_before(mailbox):
    # Same size every time, written fast: an etag built from a coarse clock and a reused inode would repeat.
    etags = [mailbox.put("head.json", b"%04d" % n) for n in range(100)]
    assert len(set(etags)) == len(etags)


def test_an_empty_object_is_stored_read_and_listed_with_size_zero(mailbox):
    etag = mailbox.put("empty", b"")
    assert mailbox.get("empty") == Object(b"", etag)
    assert mailbox.list("") == [Listing("empty", etag, 0)]


def test_a_five_megabyte_object_round_trips_byte_for_byte(mailbox):
    data = os.urandom(5 * 1024 * 1024 + 3)
    etag = mailbox.put("blobs/big", data)
    got = mailbox.get("blobs/big")
    assert got.etag == etag and got.data == data
    assert mailbox.list("blobs/") == [Listing("blobs/big", etag, len(data))]


def test_bytearray_and_memoryview_are_stored_as_their_bytes(mailbox):
    mailbox.put("a", bytearray(b"xyz"))
    mailbox.put("b", memoryview(b"0123456789")[2:5])
    assert mailbox.get("a").data == b"xyz"
    assert mailbox.get("b").data == b"234"


# -- size limits -----------------------------------------------------------------------------------


def test_an_object_over_max_bytes_is_refused_naming_its_key_size_and_limit(mailbox):
    mailbox.put("blobs/b", b"x" * 2000)
    with pytest.raises(ObjectTooLarge, match=r"blobs/b .*2000 bytes.*1999-byte limit") as raised:
        mailbox.get("blobs/b", max_bytes=1999)
    assert (raised.value.key, raised.value.size, raised.value.limit) == ("blobs/b", 2000, 1999)
    assert isinstance(raised.value, PayloadError)  # what readers of records and payloads already handle
    assert mailbox.get("blobs/b", max_bytes=2000).data == b"x" * 2000


def test_an_empty_object_reads_under_a_limit_of_zero_and_an_absent_one_is_none(mailbox):
    etag = mailbox.put("empty", b"")
    assert mailbox.get("empty", max_bytes=0) == Object(b"", etag)
    assert mailbox.get("absent", max_bytes=0) is None


def test_an_unchanged_object_answers_a_conditional_get_whatever_its_size(mailbox):
    etag = mailbox.put("head.json", b"x" * 100)
    assert mailbox.get("head.json", if_none_match=etag, max_bytes=10) == Object(None, etag)
    newer = mailbox.put("head.json", b"y" * 100)
    with pytest.raises(ObjectTooLarge):  # changed: its bytes would be read, so the limit holds
        mailbox.get("head.json", if_none_match=etag, max_bytes=10)
    assert mailbox.get("head.json", if_none_match=etag, max_bytes=100) == Object(b"y" * 100, newer)


def test_without_max_bytes_the_default_cap_applies(mailbox, monkeypatch):
    monkeypatch.setattr(limits, "DEFAULT_MAX_BYTES", 1000)
    mailbox.put("blobs/over", b"x" * 1001)
    mailbox.put("blobs/at", b"x" * 1000)
    with pytest.raises(ObjectTooLarge, match="1001 bytes, over the 1000-byte limit"):
        mailbox.get("blobs/over")
    assert mailbox.get("blobs/at").data == b"x" * 1000


@pytest.mark.parametrize("max_bytes", [-1, 1.5, "10", True])
def test_max_bytes_must_be_a_whole_number_of_bytes(mailbox, max_bytes):
    mailbox.put("k", b"x")
    with pytest.raises(ConfigError, match="max_bytes"):
        mailbox.get("k", max_bytes=max_bytes)


def test_every_mailbox_has_an_on_ignored_hook(mailbox):
    assert callable(mailbox.on_ignored)


# -- create-once -----------------------------------------------------------------------------------


def test_create_once_fails_when_the_key_exists_and_keeps_the_first_bytes(mailbox):
    etag = mailbox.put("commits/0/0000000001.json", b"first", if_absent=True)
    with pytest.raises(PreconditionFailed, match="commits/0/0000000001.json"):
        mailbox.put("commits/0/0000000001.json", b"second", if_absent=True)
    assert mailbox.get("commits/0/0000000001.json") == Object(b"first", etag)


def test_create_once_succeeds_again_after_the_key_is_deleted(mailbox):
    mailbox.put("claim", b"old", if_absent=True)
    mailbox.delete(["claim"])
    etag = mailbox.put("claim", b"new", if_absent=True)
    assert mailbox.get("claim") == Object(b"new", etag)


def test_eight_threads_creating_one_key_leave_exactly_one_winner_whose_bytes_are_stored(mailbox):
    for round_ in range(5):
        key = f"race/{round_}"
        outcome = race(8, lambda i, key=key: mailbox.put(key, f"thread {i}".encode(), if_absent=True))
        winners = [i for i, etag in outcome.items() if etag is not None]
        assert len(winners) == 1, f"round {round_}: winners {winners}"
        assert mailbox.get(key) == Object(f"thread {winners[0]}".encode(), outcome[winners[0]])


def _create_in_process(path: str, keys: list[str], index: int, barrier, outcomes) -> None:
    mailbox = DirMailbox(path)
    for key in keys:
        barrier.wait()
        try:
            mailbox.put(key, f"process {index}".encode(), if_absent=True)
            outcomes.put((key, index))
        except PreconditionFailed:
            pass


def test_directory_create_once_race_between_processes_has_exactly_one_winner(tmp_path: Path):
    processes, keys = 4, [f"race/{n}" for n in range(5)]
    # fork starts a process in milliseconds; each still has its own file descriptors and locks.
    context = multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    )
    barrier, outcomes = context.Barrier(processes), context.Queue()
    workers = [
        context.Process(target=_create_in_process, args=(str(tmp_path), keys, i, barrier, outcomes))
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    won = [outcomes.get(timeout=5) for _ in keys]
    assert outcomes.empty()
    assert sorted(key for key, _ in won) == keys  # one winner per key, no more
    mailbox = DirMailbox(tmp_path)
    for key, winner in won:
        assert mailbox.get(key).data == f"process {winner}".encode()


# -- compare-and-swap ------------------------------------------------------------------------------


def test_compare_and_swap_with_a_stale_etag_fails_and_leaves_the_object_unchanged(mailbox):
    stale = mailbox.put("head.json", b"v1")
    current = mailbox.put("head.json", b"v2")
    with pytest.raises(PreconditionFailed, match="head.json"):
        mailbox.put("head.json", b"v3", if_match=stale)
    assert mailbox.get("head.json") == Object(b"v2", current)


def test_compare_and_swap_with_the_current_etag_replaces_the_object(mailbox):
    current = mailbox.put("head.json", b"v1")
    new = mailbox.put("head.json", b"v2", if_match=current)
    assert new != current
    assert mailbox.get("head.json") == Object(b"v2", new)
    with pytest.raises(PreconditionFailed):  # the etag it replaced is now stale
        mailbox.put("head.json", b"v3", if_match=current)


def test_compare_and_swap_on_an_absent_key_fails_and_creates_nothing(mailbox):
    with pytest.raises(PreconditionFailed, match="leader.json"):
        mailbox.put("leader.json", b"me", if_match="0123456789abcdef0123456789abcdef")
    assert mailbox.get("leader.json") is None


def test_concurrent_compare_and_swap_increments_lose_no_update(mailbox, request):
    if request.node.callspec.params["mailbox"] == "s3" and request.getfixturevalue("s3_endpoint").is_moto:
        # Seen twice with the suite on two workers: 39 of 40 increments, two PUTs on one ETag both taken.
        # moto checks If-Match and then writes, not atomically, so its server loses updates under load;
        # S3 and MinIO check and write as one. SLOWLINK_S3_ENDPOINT runs this against a real store.
        pytest.skip("moto's If-Match is not atomic under concurrent writers; set SLOWLINK_S3_ENDPOINT")
    mailbox.put("counter", b"0")
    threads, increments = 4, 10
    conflicts = Counter()

    def increment(thread: int) -> str:
        for _ in range(increments):
            while True:
                current = mailbox.get("counter")
                try:
                    mailbox.put("counter", str(int(current.data) + 1).encode(), if_match=current.etag)
                    break
                except PreconditionFailed:
                    conflicts[thread] += 1
        return "done"

    assert set(race(threads, increment).values()) == {"done"}
    assert mailbox.get("counter").data == str(threads * increments).encode()


# -- conditional get -------------------------------------------------------------------------------


def test_conditional_get_returns_no_data_while_unchanged_and_the_new_data_after_a_change(mailbox):
    first = mailbox.put("head.json", b"round 1")
    assert mailbox.get("head.json", if_none_match=first) == Object(None, first)
    second = mailbox.put("head.json", b"round 2")
    assert mailbox.get("head.json", if_none_match=first) == Object(b"round 2", second)
    assert mailbox.get("head.json", if_none_match=second) == Object(None, second)


def test_conditional_get_with_an_etag_the_key_never_had_returns_the_data(mailbox):
    etag = mailbox.put("head.json", b"x")
    assert mailbox.get("head.json", if_none_match="ffffffffffffffffffffffffffffffff") == Object(b"x", etag)


# -- listing ---------------------------------------------------------------------------------------

# In byte order: 'B' (0x42) < 'a' (0x61); '-' (0x2d) < '/' (0x2f) < '1' < '2' < 'b'.
SHARED_PREFIX_KEYS = ["B", "a-b", "a/1", "a/10", "a/2", "ab", "b"]


@pytest.fixture
def shared_prefix_keys(mailbox) -> dict[str, str]:
    """SHARED_PREFIX_KEYS written in scrambled order; maps each key to its etag."""
    return {key: mailbox.put(key, key.encode() * 2) for key in ["ab", "a/2", "b", "a/10", "B", "a/1", "a-b"]}


def test_listing_everything_returns_each_key_in_byte_order_with_its_etag_and_size(
    mailbox, shared_prefix_keys
):
    expected = [Listing(key, shared_prefix_keys[key], 2 * len(key)) for key in SHARED_PREFIX_KEYS]
    assert mailbox.list("") == expected


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("a/", ["a/1", "a/10", "a/2"]),
        ("a/1", ["a/1", "a/10"]),
        ("a", ["a-b", "a/1", "a/10", "a/2", "ab"]),
        ("a/3", []),
        ("c/", []),
    ],
)
def test_listing_a_prefix_returns_exactly_the_keys_that_start_with_it(
    mailbox, shared_prefix_keys, prefix, expected
):
    assert [item.key for item in mailbox.list(prefix)] == expected


@pytest.mark.parametrize(
    ("prefix", "start_after", "expected"),
    [
        ("a/", "a/1", ["a/10", "a/2"]),
        ("a/", "a/10", ["a/2"]),
        ("a/", "a/15", ["a/2"]),  # start_after need not be a key
        ("a/", "a/2", []),
        ("a", "a-b", ["a/1", "a/10", "a/2", "ab"]),
        ("", "A", ["B", "a-b", "a/1", "a/10", "a/2", "ab", "b"]),
        ("", "a/2", ["ab", "b"]),
        ("a/", "0", ["a/1", "a/10", "a/2"]),  # before the prefix: everything under it
        ("a/", "z", []),  # after the prefix: nothing under it
    ],
)
def test_listing_after_a_key_returns_only_the_later_keys_under_the_prefix(
    mailbox, shared_prefix_keys, prefix, start_after, expected
):
    assert [item.key for item in mailbox.list(prefix, start_after=start_after)] == expected


def test_a_write_is_listed_at_once_and_a_delete_unlisted_at_once(mailbox):
    etag = mailbox.put("nodes/n1.json", b"beat 1")
    assert mailbox.list("nodes/") == [Listing("nodes/n1.json", etag, 6)]
    newer = mailbox.put("nodes/n1.json", b"beat 22")
    assert mailbox.list("nodes/") == [Listing("nodes/n1.json", newer, 7)]
    mailbox.delete(["nodes/n1.json"])
    assert mailbox.list("nodes/") == []


def test_listing_an_empty_mailbox_returns_nothing(mailbox):
    assert mailbox.list("") == []
    assert mailbox.list("rounds/", start_after="rounds/0") == []


# -- deleting --------------------------------------------------------------------------------------


def test_deleting_removes_the_named_keys_and_ignores_absent_ones(mailbox):
    for key in ["r/1", "r/2", "r/3"]:
        mailbox.put(key, b"x")
    mailbox.delete(["r/1", "r/3", "r/never-written"])
    assert [item.key for item in mailbox.list("r/")] == ["r/2"]
    assert mailbox.get("r/1") is None and mailbox.get("r/3") is None
    mailbox.delete(["r/1", "r/3"])  # again: still fine
    mailbox.delete([])
    assert mailbox.get("r/2").data == b"x"


# -- keys ------------------------------------------------------------------------------------------

INVALID_KEYS = [
    "",
    "/a",
    "a/",
    "a//b",
    "..",
    "../x",
    "a/../b",
    "./a",
    "a/./b",
    "a b",
    "a\\b",
    "é",
    "a?b",
    "a\n",
]


@pytest.mark.parametrize("key", INVALID_KEYS)
def test_an_invalid_key_is_rejected_with_config_error_by_every_verb(mailbox, key):
    with pytest.raises(ConfigError, match="key"):
        mailbox.put(key, b"x")
    with pytest.raises(ConfigError, match="key"):
        mailbox.put(key, b"x", if_absent=True)
    with pytest.raises(ConfigError, match="key"):
        mailbox.get(key)
    with pytest.raises(ConfigError, match="key"):
        mailbox.delete(["fine", key])
    assert mailbox.list("") == []


def test_a_delete_naming_one_invalid_key_deletes_nothing(mailbox):
    mailbox.put("keep", b"x")
    with pytest.raises(ConfigError):
        mailbox.delete(["keep", "../escape"])
    assert mailbox.get("keep").data == b"x"


# -- clock -----------------------------------------------------------------------------------------


def test_the_clock_reads_seconds_since_the_epoch_close_to_this_machine(mailbox):
    mailbox.put("k", b"x")  # an S3 mailbox learns the store's time from answers
    # Every store in this suite runs on this machine (or a synchronised one), so the two agree closely.
    assert abs(mailbox.clock() - time.time()) < 5.0
