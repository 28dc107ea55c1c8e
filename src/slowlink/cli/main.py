"""The `slowlink` command: entry points for people, one subcommand each.

`demo` trains a real multi-process run on this machine; `plan` says which method suits a model and a
bandwidth; `bench` and `status` will join them.
Each subcommand parses its options here and leaves the work to its own package.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _add_demo(commands: argparse._SubParsersAction) -> None:
    from ..demo.run import DemoConfig

    defaults = DemoConfig()
    demo = commands.add_parser(
        "demo",
        help="train a small GPT with several processes through a mailbox, and compare with one process",
        description=(
            "Train a small byte-level GPT on the Python standard library with several learner processes "
            "joined only by a directory mailbox (DiLoCo), then one process alone on the same number of "
            "samples, and compare their held-out loss at equal wall time."
        ),
    )
    option = demo.add_argument
    option(
        "--steps", type=int, metavar="N", default=defaults.steps, help="training steps per node (%(default)s)"
    )
    option(
        "--workers", type=int, metavar="M", default=defaults.workers, help="learner processes (%(default)s)"
    )
    option(
        "--sync-every",
        type=int,
        metavar="H",
        default=defaults.sync_every,
        help="steps between syncs (%(default)s)",
    )
    option(
        "--fragments",
        type=int,
        metavar="P",
        default=defaults.fragments,
        help="fragments synced in turn (%(default)s)",
    )
    option(
        "--batch-size",
        type=int,
        metavar="B",
        default=defaults.batch_size,
        help="sequences per step (%(default)s)",
    )
    option(
        "--mailbox", metavar="PATH", help="an empty folder for the run's mailbox (a temporary one if omitted)"
    )
    option(
        "--out", metavar="DIR", default=defaults.out, help="where loss.png and summary.json go (%(default)s)"
    )
    option("--model", choices=["small", "tiny"], default=defaults.model, help="model size (%(default)s)")
    option(
        "--seed",
        type=int,
        metavar="S",
        default=defaults.seed,
        help="seed of the model and the data (%(default)s)",
    )
    demo.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..demo.report import LiveView, print_report, write_results
    from ..demo.run import DemoConfig, run_demo

    config = DemoConfig(
        steps=args.steps,
        workers=args.workers,
        sync_every=args.sync_every,
        fragments=args.fragments,
        batch_size=args.batch_size,
        model=args.model,
        seed=args.seed,
        mailbox=args.mailbox,
        out=args.out,
    )
    console = Console()
    result = run_demo(config, LiveView(console))
    png = write_results(result, Path(config.out))
    print_report(console, result, png)
    return 0


PLAN_HELP = {  # option -> (metavar, help); every value is parsed by slowlink.plan.options
    "--params": ("N", "model parameters, e.g. 1.5e9 or 1.5B (required)"),
    "--bandwidth": ("LIST", "each worker's link, comma-separated, e.g. 100Mbps,200Mbps,1Gbps (required)"),
    "--workers": ("M", "workers (nodes) training together (8)"),
    "--step-time": ("S", "compute seconds per step, no waiting, e.g. 2.4 or 350ms"),
    "--layers": ("L", "transformer layers (default: from --params, the paper's shapes)"),
    "--latency": ("T", "one-way latency per message hop, e.g. 30ms (0)"),
    "--sync-every": ("LIST", "H values to compare, e.g. 100,500 (100)"),
    "--fragments": ("P", "Streaming DiLoCo fragments (default: one per 3 layers)"),
    "--overlap-steps": ("TAU", "steps a fragment may land late in the overlap variants (1)"),
    "--tokens": ("T", "token budget to time, e.g. 1e12 (needs --batch-tokens)"),
    "--batch-tokens": ("B", "tokens each worker trains on per step, e.g. 32k"),
    "--chips": ("C", "accelerators per worker, to derive --step-time from FLOPs (1)"),
    "--peak-flops": ("F", "peak FLOP/s per chip, to derive --step-time (989e12, H100 bf16)"),
    "--mfu": ("U", "model FLOP utilization, to derive --step-time (0.4)"),
    "--target": ("CU", "compute utilization the recommendation aims for (90%%)"),
}


def _add_plan(commands: argparse._SubParsersAction) -> None:
    plan = commands.add_parser(
        "plan",
        help="which method, H, fragments and encoding suit a model and a bandwidth",
        description=(
            "Compute utilization of DDP, DiLoCo, Streaming DiLoCo (with overlap and FP4) and Factored "
            "Gossip DiLoCo's GlobalM1 at each bandwidth, the time to train a token budget, the bandwidth "
            "each needs for 50-99%% utilization, and a recommendation. Models: docs/planning.md."
        ),
    )
    for option, (metavar, text) in PLAN_HELP.items():
        plan.add_argument(option, metavar=metavar, help=text, required=option in ("--params", "--bandwidth"))
    plan.add_argument(
        "--model",
        choices=["timeline", "closed-form", "first-order"],
        default="timeline",
        help="utilization model (%(default)s)",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON instead of tables")
    plan.add_argument("--plot", metavar="PNG", help="also draw utilization against bandwidth into this PNG")
    plan.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    from ..plan import PlanOptions, make_plan, render_json, render_text, request_from_options
    from ..plan.plot import plot_utilization

    names = [option[2:].replace("-", "_") for option in PLAN_HELP]
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    options = PlanOptions(model=args.model, **given)
    plan = make_plan(request_from_options(options))
    print(render_json(plan) if args.json else render_text(plan))
    if args.plot:
        path = plot_utilization(plan, args.plot)
        if not args.json:
            print(f"\nplot: {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slowlink", description="Train one model on machines joined by slow links."
    )
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    _add_demo(commands)
    _add_plan(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..errors import SlowlinkError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # a bare `slowlink` shows what it can do
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.handler(args)
    except SlowlinkError as error:
        print(f"slowlink {args.command}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
