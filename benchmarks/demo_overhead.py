"""Wall time of the demo's two-node run with slowlink against the same two training loops without it.

    python benchmarks/demo_overhead.py [--steps 300] [--repeats 2]

Both arms run the demo's learners (small GPT, batch 8, one thread each, held-out evaluation every 50
steps) as two processes; only the first wraps them in a Session over a DirMailbox (the demo's settings:
sync_every=25, fragments=2, quorum of both nodes, flush_on_close). The arms alternate, so a busy moment
of the machine does not fall on one arm only; the table gives every run and the medians.
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from slowlink.demo.run import DemoConfig, run_phase

sys.path.insert(0, str(Path(__file__).parent))
from _report import markdown_table, write_section  # noqa: E402


class Quiet:
    def update(self, message: dict) -> None:
        del message


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    config = DemoConfig(steps=args.steps)
    names = ["node-0", "node-1"]
    walls: dict[str, list[float]] = {"without slowlink": [], "with slowlink": []}
    rows = []
    for repeat in range(args.repeats):
        for label in walls:
            mailbox = tempfile.mkdtemp(prefix="slowlink-bench-") if label == "with slowlink" else None
            result = run_phase(config, label, names, args.steps, mailbox, Quiet())
            walls[label].append(result.wall_s)
            rounds = max((s.get("commits_applied", 0) for s in result.stats.values()), default=0)
            rows.append([repeat + 1, label, f"{result.wall_s:.1f}", f"{result.core_share:.2f}", rounds])
            print(rows[-1], flush=True)
    plain, linked = (statistics.median(walls[label]) for label in walls)
    summary = [
        ["median wall time, s", f"{plain:.1f}", f"{linked:.1f}", f"{100 * (linked / plain - 1):+.1f}%"]
    ]
    body = f"""The demo's two learner processes, {args.steps} steps each (small GPT, batch 8), with and without a
slowlink Session (`sync_every=25, fragments=2, quorum_size=2, flush_on_close=True`, DirMailbox). Wall time
runs from the moment both learners are ready to the last one's end, leaving the Session included.
Target: within 10%.

{markdown_table(["", "without slowlink", "with slowlink", "difference"], summary)}

Every run (core share: the CPU time the learners got over their wall time; near 1 on an idle machine):

{markdown_table(["repeat", "arm", "wall s", "core share", "rounds committed"], rows)}
"""
    print(body)
    write_section("demo-overhead", "Demo wall time with and without slowlink", body)


if __name__ == "__main__":
    main()
