"""`slowlink bench`: run the chosen registry entries one after the other on one task, and collect their
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
    """Every chosen method on the same task; view.begin(name, summary), view.progress(name, done, total) and
    view.done(outcome) follow them."""
    import torch

    names = chosen(config)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models train fastest on one thread, and the runs do not depend on it
    try:
        task = Task(config.model, seed=config.seed, batch_size=config.batch_size, steps=config.steps,
                    eval_windows=config.eval_windows)  # fmt: skip
        view.start(names)
        outcomes = []
        for name in names:
            entry = METHODS[name]
            view.begin(name, entry.summary)
            began, cpu = time.perf_counter(), time.process_time()
            outcome = entry.run(name, task, config, lambda done, total, n=name: view.progress(n, done, total))
            outcome.real_seconds, outcome.cpu_seconds = time.perf_counter() - began, time.process_time() - cpu
            outcomes.append(outcome)
            view.done(outcome)
    finally:
        torch.set_num_threads(threads)
        view.end()
    corpus = task.corpus
    return BenchResult(config=config, parameters=task.parameters, bandwidth=config.link_bits(task.parameters),
                       corpus={"python": corpus.python, "sha256": corpus.sha256, "bytes": corpus.size,
                               "files": corpus.files, "held_out_files": corpus.val_files},
                       outcomes=outcomes)  # fmt: skip
