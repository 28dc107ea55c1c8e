"""One life of one learner in the chaos benchmark: the demo's tiny GPT in a Session over a faulty mailbox.

    python benchmarks/chaos_worker.py ARGS_JSON

It logs every event (and its progress every few steps) as JSON lines, flushed at once, so that what a
SIGKILLed life did can still be read; a life that finishes writes its SessionStats and fault counts too.
"""

import dataclasses
import json
import sys
import threading
import time
from pathlib import Path

import torch

import slowlink as sl
from slowlink.demo.corpus import TrainWindows, load_corpus
from slowlink.demo.model import build_model, make_optimizer, train_step
from slowlink.errors import MailboxError, PayloadError
from slowlink.events import Event
from slowlink.mailbox import Faulty

PEAK_LR = 3e-3  # small batches and a high learning rate: the tiny GPT learns within a few hundred steps
JOIN_ATTEMPTS = 20
PROGRESS_EVERY = 5  # steps between progress lines: what a killed life is known to have trained


class EventLog:
    """JSON lines, one write and flush each: a line survives a SIGKILL of the process once written."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a")  # noqa: SIM115 - open for the whole life of the process
        self._lock = threading.Lock()  # events come from the training and the communication threads

    def write(self, kind: str, **data: object) -> None:
        line = json.dumps({"t": time.time(), "kind": kind, **data})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def event(self, event: Event) -> None:
        self.write(event.kind, data=event.data, message=event.message)


def inner_mailbox(store: dict):
    if store["kind"] == "dir":
        return sl.DirMailbox(store["path"])
    return sl.S3Mailbox(store["bucket"], store["prefix"], endpoint_url=store["endpoint_url"])


def open_session(make_session, log: EventLog) -> sl.Session:
    """Enter a fresh Session, and again while joining fails on an injected fault.

    Session.__enter__ does not retry the store's failures (S3Mailbox retries inside, but Faulty fails
    after that layer), so a launcher tries again, as a user's would; each attempt is logged.
    """
    for attempt in range(1, JOIN_ATTEMPTS + 1):
        session = make_session()
        try:
            return session.__enter__()
        except (MailboxError, PayloadError) as error:
            log.write("join_failed", attempt=attempt, error=str(error))
            time.sleep(0.05 * attempt)
    raise RuntimeError(f"could not join in {JOIN_ATTEMPTS} attempts")


def main(args: dict) -> None:
    torch.set_num_threads(1)
    index, life = args["index"], args["life"]
    torch.manual_seed(1000 * args["seed"] + 10 * index + life)
    log = EventLog(args["log"])
    log.write("started", node=args["node"], life=life)
    model = build_model("tiny", seed=0)
    optimizer = make_optimizer(model)
    # Each life draws its own windows: a restarted node does not replay what it trained before.
    windows = TrainWindows(load_corpus(), node=index, seed=1000 * args["seed"] + life)
    faulty = Faulty(inner_mailbox(args["store"]), seed=fault_seed(args), **args["faults"])

    def make_session() -> sl.Session:
        return sl.Session(model, algorithm=sl.DiLoCo(**args["algorithm"]), mailbox=faulty,
                          node_id=args["node"], on_event=log.event, **args["session"])  # fmt: skip

    session = open_session(make_session, log)
    # The session is already entered, so it is left by hand: __exit__ with the training loop's exception.
    try:
        for step in range(1, args["steps"] + 1):
            loss = train_step(
                model, optimizer, windows.next_batch(args["batch"]), lr=PEAK_LR * min(1.0, step / 20)
            )
            session.step(samples=args["batch"])
            if step % PROGRESS_EVERY == 0:
                log_progress(log, step, faulty, loss)
    except BaseException:
        session.__exit__(*sys.exc_info())
        raise
    session.__exit__(None, None, None)
    stats = session.stats
    log_progress(log, stats.step, faulty, None)
    result = {
        "stats": dataclasses.asdict(stats),
        "faults": dict(faulty.faults),
        "requests": dict(faulty.requests),
    }
    Path(args["out"]).write_text(json.dumps(result))


def log_progress(log: EventLog, step: int, faulty: Faulty, loss: float | None) -> None:
    log.write(
        "progress", step=step, loss=loss, faults=dict(faulty.faults), requests=sum(faulty.requests.values())
    )


def fault_seed(args: dict) -> int:
    # Faulty draws from (seed, verb, key, occurrence): each life gets its own faults, repeatably.
    return 1_000_000 * args["seed"] + 1000 * args["index"] + args["life"]


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
