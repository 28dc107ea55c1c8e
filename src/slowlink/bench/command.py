"""The `slowlink bench` subcommand: its options (every default is the preset's) and its handler, which runs
the bench, writes its files and prints the table. cli/main.py adds it to the `slowlink` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError
from ..ops.console import make_console
from ..plan.units import parse_bandwidth, parse_count, parse_duration, parse_int
from .config import BenchConfig, preset
from .registry import METHODS
from .report import LiveView, markdown_table, write_results
from .run import run_bench

BENCH_HELP = {  # option -> (metavar, help); the preset gives every default
    "--steps": ("N", "local steps per worker"),
    "--workers": ("M", "workers"),
    "--sync-every": ("H", "steps between a fragment's syncs"),
    "--fragments": ("P", "Streaming and Decoupled DiLoCo's fragments"),
    "--overlap-steps": ("TAU", "Streaming DiLoCo's overlap"),
    "--batch-size": ("B", "sequences per worker and step"),
    "--step-time": ("S", "virtual compute seconds per step, e.g. 1 or 350ms"),
    "--bandwidth": (
        "BW",
        "each worker's link, e.g. 1Mbps (default: one all-reduce of the model takes 90 steps)",
    ),
    "--latency": ("T", "per message hop, e.g. 10ms"),
    "--lr": ("LR", "AdamW's peak learning rate: DDP's and the DiLoCo family's inner one (1e-3)"),
    "--demo-lr": ("LR", "DeMo's peak learning rate (full: 1e-3; --quick: 1e-2)"),
    "--demo-topk": ("K", "DeMo's coefficients sent per 64×64 chunk (8; --smoke: 4)"),
    "--demo-decay": ("B", "DeMo's momentum decay β (0.99)"),
    "--seed": ("S", "seed of the models, the data and the schedule"),
    "--methods": ("LIST", f"comma-separated, of {', '.join(METHODS)} (default: all)"),
    "--jobs": ("J", "methods run at once, each in its own process (2); the numbers do not depend on it"),
}


def add_bench(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser(
        "bench",
        help="the methods side by side on a small GPT, in the simulator: loss, bytes, time",
        description=(
            "Train the same byte-level GPT on the Python standard library with DDP, DiLoCo, Streaming DiLoCo, "
            "Decoupled DiLoCo, DiLoCo with top-k deltas, the gossip variants, NoLoCo and DeMo: same seed, data "
            "order and samples, each on simulated workers over a modelled link. Writes a Markdown table, a PNG "
            "and a JSON file, again as each method ends. Models: docs/bench.md. Defaults: the full run (small "
            "model, 4 workers, 500 steps, H = 50, P = 3, about 27 min on 2 idle cores); --quick (tiny model, "
            "200 steps, H = 20, minutes)."
        ),
    )
    for option, (metavar, text) in BENCH_HELP.items():
        bench.add_argument(option, metavar=metavar, help=text)
    preset = bench.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true", help="a smaller model and fewer steps: minutes")
    preset.add_argument(
        "--smoke", action="store_true", help="a check that runs in seconds; numbers mean little"
    )
    bench.add_argument("--model", choices=["micro", "tiny", "small"], help="model size (the preset's)")
    bench.add_argument(
        "--exchange", choices=["allreduce", "store"], help="how DiLoCo's rounds travel (allreduce)"
    )
    bench.add_argument(
        "--out", metavar="DIR", default="slowlink-bench", help="where the files go (%(default)s)"
    )
    bench.set_defaults(handler=run_command)


def config_of(args: argparse.Namespace) -> BenchConfig:
    """The preset the options choose, with the options given changed: checked as it is built."""
    changes: dict = {"out": args.out}
    counts = (
        "--steps",
        "--workers",
        "--sync-every",
        "--fragments",
        "--batch-size",
        "--seed",
        "--jobs",
        "--demo-topk",
    )
    for option in counts:
        text = getattr(args, option[2:].replace("-", "_"))
        if text is not None:
            changes[option[2:].replace("-", "_")] = parse_int(
                option, text, low=1 if option != "--seed" else 0
            )
    if args.overlap_steps is not None:
        changes["overlap_steps"] = parse_int("--overlap-steps", args.overlap_steps, low=0)
    if args.lr is not None:
        changes["lr"] = parse_count("--lr", args.lr, example="1e-3")
    if args.demo_lr is not None:
        changes["demo_lr"] = parse_count("--demo-lr", args.demo_lr, example="1e-3")
    if args.demo_decay is not None:
        changes["demo_decay"] = _fraction("--demo-decay", args.demo_decay, example="0.99")
    if args.step_time is not None:
        changes["step_time"] = parse_duration("--step-time", args.step_time)
    if args.latency is not None:
        changes["latency"] = parse_duration("--latency", args.latency, allow_zero=True)
    if args.bandwidth is not None:
        changes["bandwidth"] = parse_bandwidth("--bandwidth", args.bandwidth)
    if args.methods is not None:
        changes["methods"] = tuple(name.strip() for name in args.methods.split(",") if name.strip())
    changes.update({name: getattr(args, name) for name in ("model", "exchange") if getattr(args, name)})
    return preset("smoke" if args.smoke else "quick" if args.quick else "full", **changes)


def _fraction(option: str, text: str, *, example: str) -> float:
    """A number for an option that BenchConfig then checks for its range (0 allowed, unlike parse_count)."""
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{option} {text!r} is not a number: write e.g. {option} {example}") from None


def run_command(args: argparse.Namespace) -> int:
    config = config_of(args)
    console = make_console()
    result = run_bench(config, LiveView(console), save=lambda so_far: write_results(so_far, Path(config.out)))
    files = write_results(result, Path(config.out))
    print(markdown_table(result))
    print("files: " + ", ".join(str(path) for path in files))
    return 0
