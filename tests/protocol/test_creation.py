"""The creation claim: nodes that start a run at once upload one initial model between them; a claim whose
holder is gone is taken over, and one whose holder fails is given back at once."""

import threading
import time

import numpy as np
import pytest

from slowlink.algorithms.diloco import DiLoCo
from slowlink.mailbox.faulty import Faulty
from slowlink.mailbox.memory import MemoryMailbox
from slowlink.protocol import keys
from slowlink.protocol.run import open_run

ALGORITHM = DiLoCo(sync_every=10)


class Counting(MemoryMailbox):
    """Counts the bytes put under blobs/, where initial models go."""

    def __init__(self) -> None:
        super().__init__()
        self.blob_bytes = 0
        self.lock = threading.Lock()

    def put(self, key, data, **conditions):
        if key.startswith("blobs/"):
            with self.lock:
                self.blob_bytes += len(data)
        return super().put(key, data, **conditions)


def start(mailbox, value: float, *, upload_seconds: float = 0.0, claim_seconds: float = 0.5, **clock):
    def initial():
        time.sleep(upload_seconds)  # a large model's upload: the others arrive meanwhile
        return [{"w": np.full(1000, value, np.float32)}]

    return open_run(mailbox, config=ALGORITHM.to_dict(), schema=[("w", (1000,), "float32")],
                    schema_digest="0" * 64, plan=[["w"]], initial=initial, node_id=f"node-{int(value)}",
                    claim_seconds=claim_seconds, **clock)  # fmt: skip


def test_of_three_nodes_starting_at_once_one_uploads_an_initial_model_through_an_upload_of_six_claim_timeouts(
    blobs_apart,
):
    mailbox, results = Counting(), {}
    gate = threading.Barrier(3)

    def node(value: float) -> None:
        gate.wait()
        results[value] = start(mailbox, value, upload_seconds=3.0, claim_seconds=0.5)

    threads = [threading.Thread(target=node, args=(float(value),)) for value in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    runs = {run.run_id for run, _ in results.values()}
    assert len(runs) == 1 and sorted(created for _, created in results.values()) == [False, False, True]
    one_model = 1000 * 4
    assert one_model < mailbox.blob_bytes < 2 * one_model  # one payload (header included), not three
    assert mailbox.get(keys.CREATING) is None  # the claim is given back


def test_a_claim_left_by_a_creator_that_died_is_taken_over_once_it_has_not_changed_for_claim_seconds():
    mailbox = MemoryMailbox()
    mailbox.put(keys.CREATING, b"\x00 junk: never read, only its etag watched", if_absent=True)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    run, created = start(mailbox, 1.0, claim_seconds=4.0, clock=lambda: now[0], sleep=sleep)
    assert created and 4.0 <= now[0] <= 4.0 + 0.5  # waited one claim timeout, and little more
    assert mailbox.get(keys.CREATING) is None
    assert start(mailbox, 2.0)[0].run_id == run.run_id


def test_a_creator_that_fails_gives_the_claim_back_and_a_waiter_creates_at_once():
    mailbox, began = MemoryMailbox(), threading.Event()

    def failing() -> None:
        def initial():
            began.set()
            time.sleep(0.5)
            raise OSError("the disk holding the checkpoint went away")

        with pytest.raises(OSError, match="went away"):
            open_run(mailbox, config=ALGORITHM.to_dict(), schema=[("w", (1000,), "float32")],
                     schema_digest="0" * 64, plan=[["w"]], initial=initial, claim_seconds=60.0)  # fmt: skip

    creator = threading.Thread(target=failing)
    creator.start()
    began.wait()
    started = time.monotonic()
    run, created = start(mailbox, 2.0, claim_seconds=60.0)
    creator.join()
    assert created and time.monotonic() - started < 10.0  # not the 60 s of a stale claim
    assert run.initial and mailbox.get(keys.CREATING) is None


def test_a_dead_creators_claim_is_taken_over_though_half_the_waiters_looks_fail():
    # Each failed look is a look missed, not the end of the wait: otherwise a node retrying its join starts
    # the claim's age again each time, and under faults a dead creator's claim holds the run back forever.
    inner = MemoryMailbox()
    inner.put(keys.CREATING, b'{"node":"gone"}', if_absent=True)
    mailbox = Faulty(inner, error_rate=0.5, seed=3, verbs=("list",))
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    run, created = start(mailbox, 1.0, claim_seconds=4.0, clock=lambda: now[0], sleep=sleep)
    assert created and now[0] >= 4.0 and mailbox.faults  # faults were injected, and waited through
    assert inner.get(keys.RUN) is not None and inner.get(keys.CREATING) is None


def test_a_waiter_whose_read_crossed_the_write_of_run_json_reads_it_again_rather_than_claim():
    # The waiter saw the claim; its holder then wrote run.json and gave the claim back, but the waiter's
    # next read of run.json had gone out before that write landed (a race only a stand-in read can pin).
    from slowlink.protocol import creation

    class Writes(MemoryMailbox):
        def put(self, key, data, **conditions):
            self.written.append(key)
            return super().put(key, data, **conditions)

    mailbox = Writes()
    mailbox.written = []
    holder = creation._take(mailbox, "holder", 30.0, if_absent=True)
    reads = iter([None, "the run"])  # the first crossed the write; the second finds it
    outcome, seen = creation._look(mailbox, "waiter", lambda: None, 30.0, time.monotonic, None)
    assert outcome is None and seen is not None  # waits: the claim is held
    holder.release()
    outcome, _ = creation._look(mailbox, "waiter", lambda: next(reads), 30.0, time.monotonic, seen)
    assert outcome == "the run" and mailbox.written == [keys.CREATING]  # found; the holder's claim only
