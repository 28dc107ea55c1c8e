"""The `slowlink demo` run: M learner processes train one model through a directory mailbox, then one
process trains alone on the same number of samples, each reporting to the parent through a queue.

Every learner runs the same plain loop; only the distributed ones wrap it in a slowlink Session.
Drawing (live table, summary, PNG) is left to report.py, the model and data to model.py and corpus.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import os
import queue as queue_module
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, SlowlinkError

# Options that count something: each must be at least 1.
_COUNTS = ("steps", "workers", "sync_every", "fragments", "batch_size", "eval_every", "eval_windows")


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    # Defaults measured on 2 cores: about three minutes in all, and the 2 nodes ahead of the process alone
    # at equal wall time (DiLoCo pulls ahead after a few hundred steps; small batches make averaging pay).
    steps: int = 600  # local steps per node; the process alone trains workers × steps
    workers: int = 2
    sync_every: int = 25
    fragments: int = 2
    batch_size: int = 8
    quorum: int | None = None  # contributions a round waits for; None: every node's (quorum_size = workers)
    model: str = "small"
    seed: int = 0
    mailbox: str | None = None  # a folder for the DirMailbox; None: a temporary one
    out: str = "slowlink-demo"
    eval_every: int = 50  # steps between held-out evaluations, on every learner alike
    eval_windows: int = 64

    def __post_init__(self) -> None:
        for name in _COUNTS:
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)} must be at least 1")
        if self.fragments > self.sync_every:
            raise ConfigError(
                f"--fragments {self.fragments} exceeds --sync-every {self.sync_every}: each fragment syncs once "
                "every sync_every steps on its own phase, so use at most sync_every fragments"
            )
        if self.quorum is not None and not 1 <= self.quorum <= self.workers:
            raise ConfigError(
                f"--quorum {self.quorum} must be between 1 and --workers {self.workers}: a round cannot wait for "
                "more contributions than there are nodes (leave it out to wait for every node)"
            )
        if self.model not in ("small", "tiny"):
            raise ConfigError(f"--model {self.model!r} is unknown; choose small or tiny")


class DemoFailed(SlowlinkError):
    """A learner process failed; the message carries its traceback."""


@dataclass
class Curve:
    """Held-out loss of one configuration as training went: total samples, seconds since start, nats."""

    samples: list[int] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)

    def loss_at_wall(self, seconds: float) -> float:
        """Linear interpolation in wall time; the last point if the curve ends earlier."""
        points = list(zip(self.wall, self.loss, strict=True))
        for (w0, l0), (w1, l1) in zip(points, points[1:], strict=False):
            if w0 <= seconds <= w1:
                return l0 + (l1 - l0) * (seconds - w0) / (w1 - w0) if w1 > w0 else l1
        return self.loss[-1] if seconds > self.wall[-1] else self.loss[0]


@dataclass
class PhaseResult:
    label: str
    nodes: list[str]
    wall_s: float
    cpu_s: float  # CPU time of all its learners together
    samples: int
    curve: Curve
    stats: dict[str, dict]  # node -> its final Session stats, as a dict; empty for the process alone
    events: list[dict]
    final_loss: float = float("nan")

    @property
    def core_share(self) -> float:
        """The share of a core each learner got: near 1 unless other programs were using the cores."""
        return self.cpu_s / (self.wall_s * len(self.nodes))


@dataclass
class DemoResult:
    config: DemoConfig
    parameters: int
    corpus: dict
    distributed: PhaseResult
    alone: PhaseResult
    alone_loss_at_equal_wall: float

    def to_dict(self) -> dict:
        result = dataclasses.asdict(self)
        for phase in ("distributed", "alone"):
            result[phase]["core_share"] = getattr(self, phase).core_share
        return result


# ---------------------------------------------------------------------------------------------------------
# The learner: one process, one thread, one plain training loop.


def learner(config: DemoConfig, node: int, name: str, steps: int, mailbox: str | None, queue, start) -> None:
    """Train `steps` steps and report to the parent; in a Session over `mailbox` unless it is None."""
    try:
        _learn(config, node, name, steps, mailbox, queue, start)
    except BaseException:
        queue.put({"kind": "error", "node": name, "traceback": traceback.format_exc()})
        raise


def _learn(config: DemoConfig, node: int, name: str, steps: int, mailbox: str | None, queue, start) -> None:
    """The learner's life: set up, wait for the others, train (in a Session if distributed), report."""
    import slowlink as sl

    from .corpus import TrainWindows, heldout_windows, load_corpus
    from .model import build_model, evaluate, lr_at, make_optimizer, train_step

    _share_the_machine_quietly()
    corpus = load_corpus()
    model = build_model(config.model, seed=config.seed)  # the same initial model on every node
    optimizer = make_optimizer(model)
    stream = TrainWindows(corpus, node=node, nodes=config.workers, seed=config.seed)
    heldout = heldout_windows(corpus, config.eval_windows)
    queue.put({"kind": "ready", "node": name})
    start.wait()
    cpu_at_start = time.process_time()  # this process's CPU time, every thread included

    # Each distributed learner keeps its events and losses in a JSON-lines file: `slowlink report` plots them.
    events = events_path(config, name) if mailbox is not None else None
    scalars = sl.events.JsonLines(events) if events is not None else None

    def held_out(step: int) -> None:
        loss = evaluate(model, heldout)
        queue.put({"kind": "eval", "node": name, "step": step, "time": time.monotonic(), "loss": loss})
        if scalars is not None:
            scalars.scalars(node=name, step=step, heldout_loss=loss)

    session = _open_session(config, model, name, mailbox, events, queue) if mailbox is not None else None
    with session or contextlib.nullcontext():
        held_out(0)
        for step in range(1, steps + 1):
            loss = train_step(model, optimizer, stream.next_batch(config.batch_size), lr=lr_at(step - 1))
            stats = {}
            if scalars is not None and step % 10 == 0:
                scalars.scalars(node=name, step=step, loss=loss)
            if session is not None:
                session.step(samples=config.batch_size)
                stats = dataclasses.asdict(session.stats)
            queue.put({"kind": "progress", "node": name, "step": step, "loss": loss, "stats": stats})
            if step % config.eval_every == 0 or step == steps:
                held_out(step)
    # After the Session has closed, its stats include what closing published.
    final = dataclasses.asdict(session.stats) if session is not None else {}
    cpu = time.process_time() - cpu_at_start
    queue.put({"kind": "done", "node": name, "time": time.monotonic(), "cpu": cpu, "stats": final})


def _share_the_machine_quietly() -> None:
    """Set this learner process to one torch thread and no slowlink log output."""
    import torch  # imported here: the parent draws and never needs torch before the results

    # One thread per learner: the demo's processes share the machine's cores fairly.
    torch.set_num_threads(1)
    # Events reach the parent through the queue; logging them too would draw over its live table.
    logging.getLogger("slowlink").addHandler(logging.NullHandler())
    logging.getLogger("slowlink").propagate = False


def _open_session(config: DemoConfig, model, name: str, mailbox: str, events: Path | None, queue):
    """A distributed learner's Session over the DirMailbox at `mailbox`, relaying its events to the parent."""
    import slowlink as sl

    def on_event(event) -> None:
        queue.put({"kind": "event", "node": name, "event": event.kind, "message": event.message})

    # flush_on_close: the steps trained after a fragment's last sync reach the final model too.
    # quorum_size: by default every round waits for every node, as in DiLoCo; a node never waits for a round.
    algorithm = sl.DiLoCo(
        sync_every=config.sync_every,
        fragments=config.fragments,
        quorum_size=config.workers if config.quorum is None else config.quorum,
        flush_on_close=True,
    )
    return sl.Session(
        model, algorithm=algorithm, mailbox=sl.DirMailbox(mailbox), node_id=name, on_event=on_event,
        events_file=events,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# The parent: start learners, relay their reports to the view, collect the results.


def run_phase(
    config: DemoConfig, label: str, names: list[str], steps: int, mailbox: str | None, view
) -> PhaseResult:
    """Run one learner process per name to the end; `view.update(message)` sees every report."""
    context = mp.get_context("spawn")  # a fresh interpreter: no inherited threads or torch state
    queue, start = context.Queue(), context.Event()
    processes = [
        context.Process(
            target=learner, args=(config, index, name, steps, mailbox, queue, start), name=f"slowlink-{name}"
        )
        for index, name in enumerate(names)
    ]
    for process in processes:
        process.start()
    evals: dict[str, list[dict]] = {name: [] for name in names}
    stats: dict[str, dict] = {}
    events: list[dict] = []
    cpu = 0.0
    try:
        for _ in names:
            _expect(_next(queue, processes), "ready")
        began = time.monotonic()
        start.set()  # wall time counts from here: after every learner has loaded the corpus and the model
        finished = began
        while len(stats) < len(names):
            message = _next(queue, processes)
            view.update(message)
            if message["kind"] == "eval":
                evals[message["node"]].append(message)
            elif message["kind"] == "event":
                events.append(message)
            elif message["kind"] == "done":
                stats[message["node"]] = message["stats"]
                finished = max(finished, message["time"])
                cpu += message["cpu"]
    except BaseException:
        for process in processes:  # one learner failed, or Ctrl-C: the others must not train on alone
            process.terminate()
        raise
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    samples = len(names) * steps * config.batch_size
    return PhaseResult(
        label=label,
        nodes=names,
        wall_s=finished - began,
        cpu_s=cpu,
        samples=samples,
        curve=_merge_curves(evals, began, config.batch_size),
        stats=dict(sorted(stats.items())) if mailbox is not None else {},
        events=events,
    )


def _next(queue, processes) -> dict:
    """The next report; a learner that died, or an error it reported, stops the run with its traceback."""
    while True:
        try:
            message = queue.get(timeout=0.5)
        except queue_module.Empty:
            dead = [p for p in processes if p.exitcode not in (None, 0)]
            if dead:
                raise DemoFailed(f"learner {dead[0].name} exited with code {dead[0].exitcode}") from None
            continue
        if message["kind"] == "error":
            raise DemoFailed(f"learner {message['node']} failed:\n{message['traceback']}")
        return message


def _expect(message: dict, kind: str) -> None:
    assert message["kind"] == kind, f"expected a {kind!r} report first, got {message}"


def _merge_curves(evals: dict[str, list[dict]], began: float, batch_size: int) -> Curve:
    """One curve for a phase: at each evaluated step, the mean over nodes of their local held-out loss,
    at the total samples of all nodes and the time the slowest node got there."""
    curve = Curve()
    by_node = list(evals.values())
    for points in zip(*by_node, strict=False):
        curve.samples.append(sum(p["step"] for p in points) * batch_size)
        curve.wall.append(max(p["time"] for p in points) - began)
        curve.loss.append(sum(p["loss"] for p in points) / len(points))
    return curve


def events_path(config: DemoConfig, name: str) -> Path:
    """Where a distributed learner appends its events and losses (JSON lines)."""
    return Path(config.out) / f"events-{name}.jsonl"


def committed_loss(config: DemoConfig, mailbox: str) -> float:
    """Held-out loss of the run's newest committed model, loaded as a user would with sl.align."""
    import slowlink as sl

    from .corpus import heldout_windows, load_corpus
    from .model import build_model, evaluate

    model = build_model(config.model, seed=config.seed)
    sl.align(model, mailbox=sl.DirMailbox(mailbox))
    return evaluate(model, heldout_windows(load_corpus(), config.eval_windows))


def run_demo(config: DemoConfig, view) -> DemoResult:
    """The distributed run, then the process alone on as many samples; `view` draws the progress."""
    from .corpus import load_corpus
    from .model import build_model

    corpus = load_corpus()
    parameters = sum(p.numel() for p in build_model(config.model).parameters())
    with tempfile.TemporaryDirectory(prefix="slowlink-demo-") as scratch:
        mailbox = config.mailbox or os.path.join(scratch, "mailbox")
        if Path(mailbox).exists() and any(Path(mailbox).iterdir()):
            raise ConfigError(
                f"--mailbox {mailbox} is not empty: a demo starts a new run; pass a new or empty folder"
            )
        names = [f"node-{i}" for i in range(config.workers)]
        Path(config.out).mkdir(parents=True, exist_ok=True)
        for name in names:  # a new run's events, not appended to an earlier demo's
            events_path(config, name).unlink(missing_ok=True)
        try:
            view.begin(f"{config.workers} nodes, DiLoCo through a directory mailbox", names, config.steps)
            distributed = run_phase(config, "distributed", names, config.steps, mailbox, view)
            distributed.final_loss = committed_loss(config, mailbox)
            alone_steps = config.workers * config.steps
            view.begin("one process alone, as many samples", ["alone"], alone_steps)
            alone = run_phase(config, "alone", ["alone"], alone_steps, None, view)
            alone.final_loss = alone.curve.loss[-1]
        finally:
            view.end()
    return DemoResult(
        config=config,
        parameters=parameters,
        corpus={
            "sha256": corpus.sha256,
            "bytes": corpus.size,
            "files": corpus.files,
            "python": corpus.python,
        },
        distributed=distributed,
        alone=alone,
        alone_loss_at_equal_wall=alone.curve.loss_at_wall(distributed.wall_s),
    )
