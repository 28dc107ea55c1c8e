"""The `slowlink` command: entry points for people, one subcommand each.

`demo` trains a real multi-process run on this machine; `plan` says which method suits a model and a
bandwidth; `status` says what a run in a mailbox is doing, `report` writes one HTML page about it;
`bench` runs the methods side by side in the simulator. Each subcommand parses its options here and leaves the work to its own package.
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
    option("--quorum", type=int, metavar="Q", help="contributions a round waits for, 1 to M (default: M)")
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
    from ..demo.report import LiveView, print_report, write_results
    from ..demo.run import DemoConfig, run_demo
    from ..ops.console import make_console

    config = DemoConfig(
        steps=args.steps,
        workers=args.workers,
        sync_every=args.sync_every,
        fragments=args.fragments,
        batch_size=args.batch_size,
        quorum=args.quorum,
        model=args.model,
        seed=args.seed,
        mailbox=args.mailbox,
        out=args.out,
    )
    console = make_console()  # on a pipe, wide enough that no table is cut
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


def _add_bench(commands: argparse._SubParsersAction) -> None:
    from ..bench.command import add_bench  # the options and their handler live with the bench

    add_bench(commands)


def open_mailbox(target: str, *, endpoint_url: str | None = None, region: str | None = None):
    """The mailbox a command names: `s3://bucket/prefix`, or the path of a directory holding a run."""
    from ..errors import ConfigError
    from ..mailbox import DirMailbox

    if target.startswith("s3://"):
        from ..mailbox import S3Mailbox

        bucket, _, prefix = target.removeprefix("s3://").partition("/")
        return S3Mailbox(bucket, prefix, endpoint_url=endpoint_url, region=region)
    if endpoint_url is not None:
        raise ConfigError(f"--endpoint-url is for s3:// mailboxes, not the directory {target}")
    if not (Path(target) / "run.json").is_file():
        raise ConfigError(
            f"{target} holds no run (no run.json): name the folder given to DirMailbox, or s3://bucket/prefix"
        )
    return DirMailbox(target)


def _add_mailbox_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mailbox", metavar="MAILBOX", help="a run's directory, or s3://bucket/prefix")
    parser.add_argument(
        "--endpoint-url", metavar="URL", help="the S3 endpoint (MinIO, R2, ...) of an s3:// mailbox"
    )
    parser.add_argument("--region", metavar="NAME", help="the S3 region of an s3:// mailbox")


def _add_status(commands: argparse._SubParsersAction) -> None:
    status = commands.add_parser(
        "status",
        help="what a run in a mailbox is doing: nodes, rounds, bytes, stalls",
        description=(
            "Read a run's mailbox (never writing to it) and show its configuration, its live and departed "
            "nodes, each fragment's newest round, the bytes moved, stalls and leader changes. The cost is a "
            "constant number of requests however long the run."
        ),
    )
    _add_mailbox_arguments(status)
    option = status.add_argument
    option("--json", action="store_true", help="print one JSON object, for programs")
    option("--watch", type=float, nargs="?", const=2.0, metavar="SECONDS",
           help="refresh in place every SECONDS (2 if omitted) until Ctrl-C")  # fmt: skip
    option(
        "--recent", type=int, default=3, metavar="N", help="commit records read per fragment (%(default)s)"
    )
    option("--observe", type=float, default=0.0, metavar="SECONDS",
           help="how long a one-off look watches leases that carry no write time (an older slowlink's) "
                "change, to tell live nodes (%(default)s)")  # fmt: skip
    option("--lease-seconds", type=float, default=120.0, metavar="SECONDS",
           help="the run's lease: a lease unchanged this long is silent (%(default)s)")  # fmt: skip
    status.set_defaults(handler=_status)


def _status(args: argparse.Namespace) -> int:
    import json
    import time

    from rich.live import Live

    from ..ops.console import make_console
    from ..ops.render import render_status
    from ..ops.status import StatusReader

    mailbox = open_mailbox(args.mailbox, endpoint_url=args.endpoint_url, region=args.region)
    reader = StatusReader(
        mailbox, name=args.mailbox, recent=max(1, args.recent), lease_seconds=args.lease_seconds
    )
    if args.watch is None:
        status = reader.read(observe_seconds=max(0.0, args.observe))
        if args.json:
            print(json.dumps(status.to_dict(), indent=2))
        else:
            make_console().print(render_status(status))
        return 0
    if args.json:  # one JSON object per line: a stream for programs
        while True:
            print(json.dumps(reader.read().to_dict()), flush=True)
            time.sleep(max(0.2, args.watch))
    with Live(render_status(reader.read()), console=make_console(), auto_refresh=False) as live:
        while True:
            time.sleep(max(0.2, args.watch))
            live.update(render_status(reader.read()), refresh=True)


def _add_report(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser(
        "report",
        help="one self-contained HTML page about a run: rounds, contributors, bytes, stalls, loss",
        description=(
            "Read a run's mailbox (never writing to it) and the nodes' events files, and write one HTML page "
            "with its plots inline: rounds and their contributors over time, bytes per node, stalls and "
            "leader changes, rejections, and loss where the nodes logged it."
        ),
    )
    _add_mailbox_arguments(report)
    option = report.add_argument
    option("--out", metavar="FILE", default="report.html", help="the page to write (%(default)s)")
    option("--events", metavar="FILE", nargs="+", action="extend", default=[],
           help="events files (JSON lines, Session(events_file=...)) to read rounds and loss from")  # fmt: skip
    option("--title", metavar="TEXT", help="the page's title (default: the run's id)")
    report.set_defaults(handler=_report)


def _report(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..events import read_events
    from ..ops.report import build_report
    from ..ops.status import StatusReader

    mailbox = open_mailbox(args.mailbox, endpoint_url=args.endpoint_url, region=args.region)
    events = []
    for path in args.events:
        if not Path(path).is_file():
            raise ConfigError(f"--events {path}: no such file")
        events += read_events(path)
    status = StatusReader(mailbox, name=args.mailbox).read()
    out = Path(args.out)
    out.write_text(build_report(status, events, title=args.title))
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slowlink", description="Train one model on machines joined by slow links."
    )
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    _add_demo(commands)
    _add_plan(commands)
    _add_bench(commands)
    _add_status(commands)
    _add_report(commands)
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
