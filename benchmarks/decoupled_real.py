"""Decoupled DiLoCo in real runs: the configurations of issue 12's table, two processes over moto's S3 server,
the held-out loss of the committed model and the wall time against the plain loop (the simulator's study is
decoupled_study.py; this confirms it on the real code, store and clock).

    python benchmarks/decoupled_real.py              # 3 repeats of 7 arms, about 8 minutes on 2 cores

The workload is s3_requests.py's: an MLP (8-64-1) fitting sum(sin(x)), Adam lr 1e-2, batches of 32, 400 steps
of 20 ms, DiLoCo(sync_every=50, fragments=2), each node on its own seeded stream; one node alone trains the
same 400 steps on node 0's stream. The committed model is what the node that leaves last holds (the newest commits); the
table gives its mean over the repeats, and the slower node's wall (median).
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).parent))
from _report import markdown_table, write_section  # noqa: E402
from s3_requests import run_pair, run_plain  # noqa: E402

ARMS = {
    "default (quorum 1, no barrier)": {},
    "default, damp_momentum=False (the default before)": {"damp_momentum": False},
    "quorum_size=2, no barrier": {"quorum_size": 2},
    "quorum_size=2, overlap_steps=0 (standard DiLoCo)": {"quorum_size": 2, "overlap_steps": 0},
    "same, outer_lr=1, outer_momentum=0 (averaging)": {"quorum_size": 2, "overlap_steps": 0, "outer_lr": 1.0,
                                                        "outer_momentum": 0.0},
    "default, merge=sl.RDA()": {"merge": "RDA"},
    "default, grace_seconds=1 (one sync)": {"grace_seconds": 1.0},
    "default, outer_momentum=0.5": {"outer_momentum": 0.5},
}  # fmt: skip


def main() -> None:
    from tests.s3server import open_s3_endpoint

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--only",
        help="run only the arms whose name holds one of these comma-separated texts (and write nothing)",
    )
    parser.add_argument(
        "--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md as it is"
    )
    options = parser.parse_args()
    texts = options.only.split(",") if options.only else [""]
    chosen = {arm: kwargs for arm, kwargs in ARMS.items() if any(text in arm for text in texts)}
    plain, losses, walls = [], {arm: [] for arm in ARMS}, {arm: [] for arm in ARMS}
    spent = {arm: [] for arm in ARMS}  # the slower node's join, session.step() and leave seconds
    with open_s3_endpoint() as endpoint, tempfile.TemporaryDirectory() as folder:
        for repeat in range(options.repeats):
            plain.append(run_plain(folder))
            for arm, kwargs in chosen.items():
                results = run_pair(endpoint, folder, kwargs)
                # The run's committed model: the node that left last holds the newest commits.
                newest = max(results, key=lambda result: sum(result["versions"]))
                losses[arm].append(newest["loss"])
                slower = max(results, key=lambda result: result["wall"])
                walls[arm].append(slower["wall"])
                spent[arm].append(slower["spent"])
                parts = ", ".join(f"{part} {seconds:.2f}" for part, seconds in slower["spent"].items())
                print(f"repeat {repeat}: {arm}: loss {[round(r['loss'], 4) for r in results]}, "
                      f"wall {walls[arm][-1]:.2f} s ({parts}), plain {plain[-1]['wall']:.2f} s", flush=True)  # fmt: skip
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"] * 3
    plain_wall = statistics.median(p["wall"] for p in plain)
    alone = statistics.mean(p["loss"] for p in plain)
    standard_arm = "quorum_size=2, overlap_steps=0 (standard DiLoCo)"
    standard = statistics.mean(losses[standard_arm]) if losses[standard_arm] else float("nan")
    rows = [["one node alone, same 400 steps", f"{alone:.4f}", "", f"{plain_wall:.2f} s", "", "", ""]]
    for arm in chosen:
        loss, wall = statistics.mean(losses[arm]), statistics.median(walls[arm])
        parts = [
            f"{statistics.median(s[part] for s in spent[arm]):.2f}" for part in ("join", "step", "leave")
        ]
        rows.append(
            [arm, f"{loss:.4f}", f"{loss / standard:.2f}×", f"{100 * (wall / plain_wall - 1):+.1f}%", *parts]
        )
    table = markdown_table(
        ["configuration", "held-out MSE", "over standard DiLoCo", "wall over the plain loop", "join s",
         "in session.step() s", "leave s"], rows,
    )  # fmt: skip
    print(table)
    if options.no_write or options.only is not None:
        return
    body = f"""Two processes over moto's S3 server on 127.0.0.1, the workload of `s3_requests.py` (an MLP fitting
sum(sin(x)), 400 steps of 20 ms, `DiLoCo(sync_every=50, fragments=2)`); the held-out MSE of the committed
model (the newest commits, which the node that left last holds), mean over {options.repeats} repeats; wall: the slower node's, median, against the plain
loop's in the same kind of process. Load average at the end: {" ".join(load)} (2 cores, shared). On this
workload (Adam at lr 1e-2, rounds about a sync long) outer Nesterov 0.7/0.9 overshoots: averaging and
outer_momentum=0.5 train better than the default momentum.

{table}
"""
    write_section("decoupled-real", "Decoupled DiLoCo in real runs over S3", body)


if __name__ == "__main__":
    main()
