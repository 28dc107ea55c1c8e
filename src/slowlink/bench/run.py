"""`slowlink bench`: run the chosen registry entries on one task, a few at a time in processes of their own, and collect their
outcomes with what a reader needs to reproduce them (the options, the link, the corpus, the model's size).
Drawing is left to report.py."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

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
    outcomes: list[Outcome]

    def outcome(self, name: str) -> Outcome | None:
        return next((o for o in self.outcomes if o.name == name), None)

    def to_dict(self) -> dict:
        return {"config": asdict(self.config), "parameters": self.parameters, "bandwidth": self.bandwidth,
                "corpus": self.corpus, "outcomes": [o.to_dict() for o in self.outcomes]}  # fmt: skip


def chosen(config: BenchConfig) -> list[str]:
    unknown = [name for name in config.methods if name not in METHODS]
    if unknown:
        raise ConfigError(f"--methods {','.join(unknown)}: no such method; choose from {', '.join(METHODS)}")
    return list(config.methods) or list(METHODS)


def run_bench(config: BenchConfig, view) -> BenchResult:
    """Every chosen method on the same task, config.jobs at a time (each job its own process, one thread);
    view.begin(name, summary), view.progress(name, done, total) and view.done(outcome) follow them. Every
    entry depends on the seed alone, so the jobs change the wall time, never a number."""
    names = chosen(config)
    view.start(names)
    try:
        if config.jobs == 1 or len(names) == 1:
            outcomes = [run_entry(name, config, view) for name in names]
        else:
            outcomes = run_in_processes(names, config, view)
    finally:
        view.end()
    task = make_task(config)
    corpus = task.corpus
    return BenchResult(config=config, parameters=task.parameters, bandwidth=config.link_bits(task.parameters),
                       corpus={"python": corpus.python, "sha256": corpus.sha256, "bytes": corpus.size,
                               "files": corpus.files, "held_out_files": corpus.val_files},
                       outcomes=outcomes)  # fmt: skip


def make_task(config: BenchConfig) -> Task:
    return Task(config.model, seed=config.seed, batch_size=config.batch_size, steps=config.steps,
                eval_windows=config.eval_windows)  # fmt: skip


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
    view.done(outcome)
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

    def done(self, outcome: Outcome) -> None:
        pass  # the outcome itself comes back as the job's result


def _job(name: str, config: BenchConfig, queue) -> Outcome:
    return run_entry(name, config, _Relay(queue))


def run_in_processes(names: list[str], config: BenchConfig, view) -> list[Outcome]:
    """The entries as jobs of a pool of config.jobs fresh processes; the view hears their messages here."""
    import multiprocessing
    import queue as queues
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("spawn")  # no state of this process (torch's threads) is copied
    with context.Manager() as manager, ProcessPoolExecutor(config.jobs, mp_context=context) as pool:
        messages = manager.Queue()
        jobs = {pool.submit(_job, name, config, messages): name for name in names}
        outcomes, pending = {}, set(jobs)
        while pending:
            finished, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            while True:
                try:
                    kind, name, *rest = messages.get_nowait()
                except queues.Empty:
                    break
                getattr(view, kind)(name, *rest)
            for job in finished:
                outcomes[jobs[job]] = job.result()  # a job's error is raised here, with its traceback
                view.done(outcomes[jobs[job]])
    return [outcomes[name] for name in names]
