"""What a bench run is: its options, checked when built, and the three presets (full, --quick, --smoke).

The link is given in bits/s, or left to be derived so that one fp32 all-reduce of the whole model takes
SYNC_STEPS compute steps: the regime research/algorithms.md §8 uses to mimic a slow link at small scale.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import ConfigError

SYNC_STEPS = 90  # T_AR(4N bytes) / T_c: FGDiLoCo's 1.5B model on 100 Mbps links (§8)
EXCHANGES = ("allreduce", "store")
SIZES = ("micro", "tiny", "small")
_COUNTS = ("steps", "workers", "sync_every", "fragments", "batch_size", "eval_windows", "demo_topk", "jobs")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    steps: int = 500  # local steps per worker; DDP and DeMo take as many global steps
    workers: int = 4
    sync_every: int = 50  # H
    fragments: int = 3  # Streaming and Decoupled: the embeddings, then blocks {0, 2} and {1, 3}
    overlap_steps: int = 2  # Streaming's τ
    batch_size: int = 8  # sequences of 128 bytes per worker and step
    model: str = "small"
    seed: int = 0
    step_time: float = 1.0  # virtual compute seconds of one step on one worker
    bandwidth: float | None = None  # bits/s of each worker's link; None: derived from SYNC_STEPS
    latency: float = 0.01  # seconds per message hop
    exchange: str = "allreduce"  # how DiLoCo's rounds travel; DDP and DeMo always use a ring
    eval_windows: int = 64  # held-out windows for the final loss
    lr: float = 1e-3  # AdamW's peak learning rate: DDP's, and the inner one of every DiLoCo-family method
    demo_topk: int = 8
    # DeMo's peak learning rate, chosen by held-out loss on each preset (docs/BENCHMARKS.md): on the full one's
    # small model, 3e-4, 1e-3, 2e-3, 3e-3 and 1e-2 end at 2.759, 2.336, 2.488, 2.626 and 2.758 (1e-2, the tiny
    # model's best, stalls: a sign step moves every parameter by lr, whatever its gradient); --quick and
    # --smoke keep 1e-2
    demo_lr: float = 1e-3
    # DeMo's momentum decay β: 0.99, a memory of about 100 steps. The paper's 0.999 (about 1,000) is longer
    # than these runs and ends worse at every seed tried: full preset, seeds 0, 1, 2, 2.4865 / 2.3160 /
    # 2.3274 at 0.999 against 2.2728 / 2.2581 / 2.2442 at 0.99 (0.9: 2.3092 at seed 0); --quick 2.6699 /
    # 2.7169 / 2.7852 against 2.6489 / 2.6923 / 2.6983 (docs/BENCHMARKS.md, bench-full)
    demo_decay: float = 0.99
    methods: tuple[str, ...] = ()  # registry names; empty: every entry
    jobs: int = 2  # entries run at once, each in its own process on one thread: the bench's 2 cores
    out: str = "slowlink-bench"

    def __post_init__(self) -> None:
        for name in _COUNTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} {value!r} must be a whole number ≥ 1")
        if self.workers < 2:
            raise ConfigError(f"--workers {self.workers}: a comparison of methods needs at least 2 workers")
        if self.fragments > self.sync_every:
            raise ConfigError(f"--fragments {self.fragments} exceeds --sync-every {self.sync_every}: "
                              "each fragment syncs once every H steps, so use at most H fragments")  # fmt: skip
        if not 0 <= self.overlap_steps < self.sync_every // self.fragments:
            raise ConfigError(f"--overlap-steps {self.overlap_steps} must lie in [0, H / fragments) = "
                              f"[0, {self.sync_every // self.fragments}): a fragment's round must land "
                              "before its next sync")  # fmt: skip
        if self.model not in SIZES:
            raise ConfigError(f"--model {self.model!r} is unknown; choose one of {', '.join(SIZES)}")
        if self.exchange not in EXCHANGES:
            raise ConfigError(
                f"--exchange {self.exchange!r} is unknown; choose one of {', '.join(EXCHANGES)}"
            )
        if not 0 < self.lr < 1:
            raise ConfigError(f"--lr {self.lr} must lie in (0, 1), e.g. 1e-3")
        if not 0 < self.demo_lr < 1:
            raise ConfigError(f"--demo-lr {self.demo_lr} must lie in (0, 1), e.g. 1e-3")
        if not 0 <= self.demo_decay < 1:
            raise ConfigError(f"--demo-decay {self.demo_decay} must lie in [0, 1), e.g. 0.99")
        if not self.step_time > 0 or not self.latency >= 0:
            raise ConfigError(f"--step-time {self.step_time} must be > 0 and --latency {self.latency} ≥ 0")
        if self.bandwidth is not None and not self.bandwidth > 0:
            raise ConfigError(f"--bandwidth {self.bandwidth} must be a positive number of bits/s, e.g. 1Mbps")

    def link_bits(self, parameters: int) -> float:
        """The workers' bandwidth: as given, or the one at which T_AR(4·N bytes) = SYNC_STEPS · T_c."""
        if self.bandwidth is not None:
            return self.bandwidth
        ring = 2 * (self.workers - 1) / self.workers
        seconds = SYNC_STEPS * self.step_time - 2 * (self.workers - 1) * self.latency
        if seconds <= 0:
            raise ConfigError(f"--latency {self.latency} alone exceeds {SYNC_STEPS} steps per all-reduce: "
                              "lower it, or give --bandwidth")  # fmt: skip
        return ring * 8 * 4 * parameters / seconds

    def speeds(self, ratio: float) -> list[float]:
        """Each worker's step time: the first half at step_time, the rest `ratio` times slower."""
        half = self.workers // 2
        return [self.step_time] * half + [self.step_time * ratio] * (self.workers - half)


PRESETS = {
    # CPU measured on this branch: full 3,200 s (27 min on 2 idle cores), quick 290 s (2.5 min), smoke seconds.
    "full": BenchConfig(),
    # the tiny model's DeMo lr: of 1e-3, 3e-3, 1e-2 and 2e-2, 1e-2 ends lowest (3.06, 2.81, 2.66, 2.84)
    "quick": BenchConfig(model="tiny", steps=200, sync_every=20, overlap_steps=1, demo_lr=1e-2),
    "smoke": BenchConfig(
        model="micro",
        workers=2,
        steps=8,
        sync_every=4,
        fragments=2,
        overlap_steps=1,
        batch_size=2,
        eval_windows=4,
        demo_topk=4,
        demo_lr=1e-2,
    ),  # fmt: skip
}


def preset(name: str, **changes) -> BenchConfig:
    """A preset with some options changed; unknown names list the presets."""
    if name not in PRESETS:
        raise ConfigError(f"preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], **changes)
