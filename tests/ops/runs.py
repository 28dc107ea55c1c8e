"""Runs for the operating tests: several sessions in one process, one thread each, that can pause in
the middle of training (inside their Sessions, leases beating) so that a reader sees a run in progress
whose every figure can be compared with what the nodes themselves report."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict

import slowlink as sl
from tests.session.nodes import batches, sgd_step, tiny_mlp


class EventLog:
    """Collects every node's events; `bytes_sent(node)` sums its contribution payloads as it reported them."""

    def __init__(self) -> None:
        self.events: list[sl.Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: sl.Event) -> None:
        with self._lock:
            self.events.append(event)

    def payload_bytes(self) -> dict[str, int]:
        sent: dict[str, int] = defaultdict(int)
        for event in list(self.events):
            if event.kind == "contribution_sent":
                sent[event.node] += event.data["bytes"]
        return dict(sent)


@contextlib.contextmanager
def paused_run(count: int, algorithm, mailbox, *, steps: int, pause_at: int, **session_options):
    """Train `count` nodes; each pauses after `pause_at` steps, inside its Session, until the block ends,
    then trains to `steps` and leaves. Yields (sessions, stats) once every node is paused and every round
    its contributions are in has committed; `stats` is filled with each node's final stats at the end."""
    models = [tiny_mlp() for _ in range(count)]
    sessions: list = [None] * count
    stats: list = [None] * count
    errors: list[BaseException] = []
    paused, resume = threading.Barrier(count + 1), threading.Event()

    def node(i: int) -> None:
        try:
            with sl.Session(models[i], algorithm=algorithm, mailbox=mailbox, node_id=f"node-{i}",
                            poll_seconds=0.01, **session_options) as session:  # fmt: skip
                sessions[i] = session
                for step, batch in enumerate(batches(i, steps), start=1):
                    sgd_step(models[i], batch, 0.1)
                    session.step(samples=len(batch[0]))
                    if step == pause_at:
                        paused.wait(timeout=120)
                        resume.wait(timeout=300)
            stats[i] = session.stats
        except BaseException as error:
            errors.append(error)
            paused.abort()

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    try:
        paused.wait(timeout=120)
        _settle(sessions)
        yield sessions, stats
    finally:
        resume.set()
        for thread in threads:
            thread.join(timeout=120)
    if errors:
        raise errors[0]


def held_versions(session) -> list[int]:
    """The newest commit of each fragment that the node's communication thread holds (its lease says so)."""
    return [session.courier.latest[q][0] for q in range(len(session.plan))]


def _settle(sessions, timeout: float = 60.0) -> None:
    """Wait until no node awaits a commit for a contribution and all hold the same commits; then for two
    beats, so that every lease says so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        versions = {tuple(held_versions(session)) for session in sessions}
        if len(versions) == 1 and not any(s.courier.sent or not s.courier.outbox.empty() for s in sessions):
            time.sleep(2.5 * sessions[0].courier.beat_seconds)
            return
        time.sleep(0.05)
    raise AssertionError("the paused nodes' rounds did not settle")
