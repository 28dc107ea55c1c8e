"""`slowlink bench`: run the chosen registry entries on one task, a few at a time in processes of their own, and collect their
outcomes with what a reader needs to reproduce them (the options, the link, the corpus, the model's size).
Drawing is left to report.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..errors import ConfigError
from .config import BenchConfig
from .outcome import Outcome
from .registry import METHODS
from .task import Task


@dataclass
class BenchResult:
    config: BenchConfig
    parameters: int
    bandwidth: float  # bits/s of each worker's link, as given or derived
    corpus: dict
    outcomes: list[Outcome]  # of the methods finished, in the order chosen
    unfinished: list[str] = field(default_factory=list)  # chosen, not finished (yet)

    def outcome(self, name: str) -> Outcome | None:
        return next((o for o in self.outcomes if o.name == name), None)

    def to_dict(self) -> dict:
        return {"config": asdict(self.config), "parameters": self.parameters, "bandwidth": self.bandwidth,
                "corpus": self.corpus, "outcomes": [o.to_dict() for o in self.outcomes],
                "unfinished": self.unfinished}  # fmt: skip


def chosen(config: BenchConfig) -> list[str]:
    unknown = [name for name in config.methods if name not in METHODS]
    if unknown:
        raise ConfigError(f"--methods {','.join(unknown)}: no such method; choose from {', '.join(METHODS)}")
    return list(config.methods) or list(METHODS)


def run_bench(config: BenchConfig, view, save: Callable[[BenchResult], object] | None = None) -> BenchResult:
    """Every chosen method on the same task, config.jobs at a time (each job its own process, one thread);
    view.begin(name, summary), view.progress(name, done, total) and view.done(outcome) follow them, and
    save(result) hears the result so far each time a method ends (a long run keeps what it finished). Every
    entry depends on the seed alone, so the jobs change the wall time, never a number."""
    names = chosen(config)
    task = make_task(config)
    finished: dict[str, Outcome] = {}

    def so_far() -> BenchResult:
        corpus = task.corpus
        return BenchResult(config=config, parameters=task.parameters,
                           bandwidth=config.link_bits(task.parameters),
                           corpus={"python": corpus.python, "sha256": corpus.sha256, "bytes": corpus.size,
                                   "files": corpus.files, "held_out_files": corpus.val_files},
                           outcomes=[finished[name] for name in names if name in finished],
                           unfinished=[name for name in names if name not in finished])  # fmt: skip

    def record(outcome: Outcome) -> None:
        finished[outcome.name] = outcome
        view.done(outcome)
        if save is not None:
            save(so_far())

    view.start(names)
    try:
        if config.jobs == 1 or len(names) == 1:
            for name in names:
                record(run_entry(name, config, view))
        else:
            run_in_processes(names, config, view, record)
    finally:
        view.end()
    return so_far()


def make_task(config: BenchConfig) -> Task:
    return Task(config.model, seed=config.seed, batch_size=config.batch_size, steps=config.steps,
                eval_windows=config.eval_windows, lr=config.lr)  # fmt: skip


def run_entry(name: str, config: BenchConfig, view) -> Outcome:
    """One entry on one torch thread (tiny models train fastest so, and a thread count can change the
    rounding of a sum); its wall and CPU seconds recorded."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        entry = METHODS[name]
        view.begin(name, entry.summary)
        began, cpu = time.perf_counter(), time.process_time()
        outcome = entry.run(
            name, make_task(config), config, lambda done, total: view.progress(name, done, total)
        )
        outcome.real_seconds, outcome.cpu_seconds = time.perf_counter() - began, time.process_time() - cpu
    finally:
        torch.set_num_threads(threads)
    return outcome


class _Relay:
    """The view of a job in another process: it forwards what it hears, progress at most every 1%."""

    def __init__(self, queue) -> None:
        self.queue, self.shown = queue, {}

    def begin(self, name: str, summary: str) -> None:
        self.queue.put(("begin", name, summary))

    def progress(self, name: str, done: int, total: int) -> None:
        if done == total or done - self.shown.get(name, 0) >= total / 100:
            self.shown[name] = done
            self.queue.put(("progress", name, done, total))


_messages = None  # a job process's queue to the parent, set when the process starts


def _start_job_process(messages) -> None:
    """Each job process, as it starts: keep the queue to the parent, and die as soon as the parent does. A
    parent killed by a signal runs no cleanup; without this its jobs would train on for minutes."""
    import multiprocessing
    import os
    import threading
    from multiprocessing.connection import wait as wait_for

    global _messages
    _messages = messages
    parent = multiprocessing.parent_process()  # its sentinel becomes ready when the parent exits

    def exit_with_parent() -> None:
        wait_for([parent.sentinel])
        os._exit(1)

    threading.Thread(target=exit_with_parent, name="exit-with-parent", daemon=True).start()


def _job(name: str, config: BenchConfig) -> Outcome:
    return run_entry(name, config, _Relay(_messages))


def run_in_processes(names: list[str], config: BenchConfig, view, record: Callable[[Outcome], None]) -> None:
    """The entries as jobs of a pool of config.jobs fresh processes, which end with this one however it ends;
    the view hears their messages here, and record(outcome) each outcome as its job ends."""
    import multiprocessing
    import queue as queues
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("spawn")  # no state of this process (torch's threads) is copied
    messages = context.Queue()  # handed to each process as it starts: no manager process to outlive us
    with ProcessPoolExecutor(config.jobs, mp_context=context, initializer=_start_job_process,
                             initargs=(messages,)) as pool:  # fmt: skip
        jobs = {pool.submit(_job, name, config): name for name in names}
        pending = set(jobs)
        while pending:
            finished, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            while True:
                try:
                    kind, name, *rest = messages.get_nowait()
                except queues.Empty:
                    break
                getattr(view, kind)(name, *rest)
            for job in finished:
                record(job.result())  # a job's error is raised here, with its traceback
