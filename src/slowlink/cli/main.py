"""The `slowlink` command: entry points for people, one subcommand each.

`demo` trains a real multi-process run on this machine; `bench`, `plan` and `status` will join it.
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slowlink", description="Train one model on machines joined by slow links."
    )
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    _add_demo(commands)
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
