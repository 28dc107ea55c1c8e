"""Decoupled DiLoCo against the barrier and one node alone, in the simulator: held-out loss of the committed
model and simulated wall time, over node counts, speed mixes and store latencies (issue 12).

    python benchmarks/decoupled_study.py           # 2, 4, 8 nodes, both workloads; about 15 minutes on one core
    python benchmarks/decoupled_study.py --quick   # 2 nodes only; about a minute; writes nothing
    python benchmarks/decoupled_study.py --cells cells.jsonl   # resumable: finished cells are kept there

Two workloads. "study": an MLP (16-64-64-1, tanh) regressing a fixed random tanh teacher plus noise, each node
on its own seeded stream of batches of 32, AdamW lr 1e-3. "s3": the real runs' (s3_requests.py,
decoupled_real.py): an MLP (8-64-1) fitting sum(sin(x)), Adam lr 1e-2, node n on torch's stream seeded 100 + n,
2 nodes only. Both: 400 steps of 20 ms (jitter 10%), H = 50, 2 fragments. The store's request latency is set
so that a round (a PUT and a GET) takes 0.2, 1 or 4 times H steps. Arms: the barrier (standard Streaming
DiLoCo, quorum_size=nodes, overlap_steps=0), averaging without a barrier (outer_lr=1, outer_momentum=0), the
default before this session (damp_momentum=False), the default, a grace window of one sync, RDA, and
flush_on_close; and one node alone (a plain loop on node 0's stream). The committed model is the one the last
node to leave holds. "slow share": the slow nodes' share of the samples the default's commits merged.
"""

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

import slowlink as sl
from slowlink import sim

sys.path.insert(0, str(Path(__file__).parent))
from _report import markdown_table, write_section  # noqa: E402

IN, HIDDEN, BATCH, STEPS, STEP_SECONDS, H, FRAGMENTS = 16, 64, 32, 400, 0.02, 50, 2
ROUND_IN_SYNCS = (0.2, 1.0, 4.0)  # a round's PUT + GET, in units of H steps
PLOT = Path(__file__).resolve().parent.parent / "docs" / "decoupled_study.png"


def arms(nodes: int) -> dict[str, sl.DiLoCo]:
    return {
        "barrier": sl.DiLoCo(sync_every=H, fragments=FRAGMENTS, quorum_size=nodes, overlap_steps=0),
        "averaging": sl.DiLoCo(
            sync_every=H, fragments=FRAGMENTS, outer_lr=1.0, outer_momentum=0.0, adaptive_outer=False
        ),  # fmt: skip
        "no damping (before)": sl.DiLoCo(sync_every=H, fragments=FRAGMENTS, damp_momentum=False),
        "default": sl.DiLoCo(sync_every=H, fragments=FRAGMENTS),
        "grace 1 sync": sl.DiLoCo(sync_every=H, fragments=FRAGMENTS, grace_seconds=H * STEP_SECONDS),
        "rda": sl.DiLoCo(sync_every=H, fragments=FRAGMENTS, merge=sl.RDA()),
        "flush on close": sl.DiLoCo(sync_every=H, fragments=FRAGMENTS, flush_on_close=True),
    }


_teacher = torch.Generator().manual_seed(1234)
W1, W2 = torch.randn(IN, 32, generator=_teacher) / IN**0.5, torch.randn(32, 1, generator=_teacher) / 32**0.5


def draw(seed: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, IN, generator=generator)
    return x, 2 * torch.tanh(x @ W1) @ W2 + 0.1 * torch.randn(count, 1, generator=generator)


HELD_OUT = draw(99_999, 2048)


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN),
                               torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))  # fmt: skip


def batches(node: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return draw(100_000 * (node + 1) + step, BATCH)


def mse(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def held_out(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(mse(model, HELD_OUT))


def network(round_in_syncs: float) -> sim.Network:
    return sim.Network(store=sim.Store(request_latency=round_in_syncs * H * STEP_SECONDS / 2))


class Workload(NamedTuple):
    make_model: Callable[[], torch.nn.Module]
    batches: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
    held_out: Callable[[torch.nn.Module], float]
    optimizer: Callable[[object], torch.optim.Optimizer]


def _s3_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))


_S3_X = torch.randn(2048, 8, generator=torch.Generator().manual_seed(99_999))
_S3_HELD_OUT = (_S3_X, _S3_X.sin().sum(1, keepdim=True))


@functools.cache
def _s3_stream(node: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Node n's batches as s3_requests.py's worker draws them: one generator seeded 100 + n, in step order."""
    generator = torch.Generator().manual_seed(100 + node)
    xs = [torch.randn(BATCH, 8, generator=generator) for _ in range(STEPS)]
    return [(x, x.sin().sum(1, keepdim=True)) for x in xs]


def _s3_held_out(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(mse(model, _S3_HELD_OUT))


WORKLOADS = {
    "study": Workload(make_model, batches, held_out, lambda params: torch.optim.AdamW(params, lr=1e-3)),
    "s3": Workload(_s3_model, lambda node, step: _s3_stream(node)[step], _s3_held_out,
                   lambda params: torch.optim.Adam(params, lr=1e-2)),
}  # fmt: skip


def alone(steps: int = STEPS, workload: str = "study") -> float:
    """One plain node: node 0's stream, no slowlink."""
    chosen = WORKLOADS[workload]
    torch.manual_seed(0)
    model = chosen.make_model()
    optimizer = chosen.optimizer(model.parameters())
    for step in range(steps):
        optimizer.zero_grad()
        mse(model, chosen.batches(0, step)).backward()
        optimizer.step()
    return chosen.held_out(model)


def simulate(
    method: sl.DiLoCo, nodes: int, speeds: list[float], round_in_syncs: float, workload: str = "study"
) -> dict:
    chosen = WORKLOADS[workload]
    result = sim.run(method, chosen.make_model, chosen.batches, loss=mse, workers=nodes, steps=STEPS,
                     step_seconds=[STEP_SECONDS * s for s in speeds], jitter=0.1,
                     network=network(round_in_syncs), seed=0, optimizer=chosen.optimizer)  # fmt: skip
    last = max(range(nodes), key=lambda i: result.workers[i].wall_seconds)
    fastest = min(result.workers, key=lambda report: report.wall_seconds)
    fast_wall = fastest.wall_seconds
    slow = {i for i, s in enumerate(speeds) if s > min(speeds)}
    merged = [(worker, samples) for commit in result.commits for worker, _, samples in commit.contributors]
    slow_share = sum(n for w, n in merged if w in slow) / max(1, sum(n for _, n in merged))
    return {"loss": chosen.held_out(result.models[last]), "wall": result.wall_seconds, "fast_wall": fast_wall,
            "commits": len(result.commits), "stalled": max(r.stalled_seconds for r in result.workers),
            "fast_stalled": sum(seconds for _, seconds, why in fastest.stalls if why != "leaving"), "slow_share": slow_share}  # fmt: skip


def _key(row: dict) -> tuple:
    return row["workload"], row["nodes"], row["speeds"], row["round"], row["arm"]


def _load_cells(path: Path | None) -> dict[tuple, dict]:
    """Cells a run already finished (--cells): one JSON row a line, keyed by workload, nodes, speeds, round, arm."""
    if path is None or not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {_key(row): row for row in rows}


def study(
    node_counts: list[int],
    rounds: tuple[float, ...],
    chosen: list[str],
    workload: str,
    cells: Path | None = None,
) -> list[dict]:
    """Every cell's row; with `cells`, those already in that file are read back, and each new one appended."""
    rows, done = [], _load_cells(cells)
    for nodes in node_counts:
        for mix, speeds in (
            ("1:1", [1.0] * nodes),
            ("1:2", [1.0 if i % 2 == 0 else 2.0 for i in range(nodes)]),
        ):
            for round_in_syncs in rounds:
                for arm, method in arms(nodes).items():
                    if arm not in chosen:
                        continue
                    started = time.perf_counter()
                    row = {
                        "workload": workload,
                        "nodes": nodes,
                        "speeds": mix,
                        "round": round_in_syncs,
                        "arm": arm,
                    }
                    if _key(row) in done:
                        rows.append(done[_key(row)])
                        continue
                    row.update(simulate(method, nodes, speeds, round_in_syncs, workload))
                    print(f"{row}  ({time.perf_counter() - started:.1f} s)", flush=True)
                    rows.append(row)
                    if cells is not None:
                        with cells.open("a") as file:
                            file.write(json.dumps(row) + "\n")
    return rows


def plot(rows: list[dict], single: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    figure, axes = plt.subplots(1, len(ROUND_IN_SYNCS), figsize=(13, 4), sharey=True)
    colors = {"barrier": "black", "averaging": "tab:green", "no damping (before)": "tab:red",
              "default": "tab:blue", "grace 1 sync": "tab:cyan", "rda": "tab:purple",
              "flush on close": "tab:orange"}  # fmt: skip
    for axis, round_in_syncs in zip(axes, ROUND_IN_SYNCS, strict=True):
        for arm, color in colors.items():
            for mix, style in (("1:1", "-"), ("1:2", "--")):
                points = [(r["nodes"], r["loss"]) for r in rows if r["workload"] == "study" and r["arm"] == arm
                          and r["speeds"] == mix and r["round"] == round_in_syncs]  # fmt: skip
                if points:
                    axis.plot([n for n, _ in points], [loss for _, loss in points], style, marker="o",
                              color=color, label=f"{arm}, speeds {mix}")  # fmt: skip
        axis.axhline(single, color="grey", linestyle=":", label="one node alone")
        axis.set(title=f"round = {round_in_syncs:g}·H steps", xlabel="nodes", xscale="log", yscale="log")
        axis.set_xticks([2, 4, 8], ["2", "4", "8"])
        axis.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())  # only the node counts on a log axis
    axes[0].set_ylabel("held-out MSE, committed model\n(study workload)")
    axes[-1].legend(
        fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0)
    )  # beside the panels, not on them
    figure.tight_layout()
    figure.savefig(PLOT, dpi=110, bbox_inches="tight")


def report(rows: list[dict], workload: str, single: float) -> str:
    rows = [r for r in rows if r["workload"] == workload]
    names = list(dict.fromkeys(r["arm"] for r in rows))
    header = ["nodes", "speeds", "round / H steps", *names, "default / barrier", "barrier wall s",
              "default wall s (fastest node; its waits s, leaving aside)", "slow nodes' share of merged samples"]  # fmt: skip
    table = []
    for key in dict.fromkeys((r["nodes"], r["speeds"], r["round"]) for r in rows):
        by_arm = {r["arm"]: r for r in rows if (r["nodes"], r["speeds"], r["round"]) == key}
        barrier, default = by_arm.get("barrier"), by_arm.get("default")
        extra = [f"{default['loss'] / barrier['loss']:.2f}×" if barrier and default else "",
                 f"{barrier['wall']:.1f}" if barrier else "",
                 f"{default['wall']:.1f} ({default['fast_wall']:.1f}; {default['fast_stalled']:.1f})" if default else "",
                 f"{default['slow_share']:.2f}" if default and key[1] == "1:2" else ""]  # fmt: skip
        table.append([*key, *(f"{by_arm[arm]['loss']:.4f}" for arm in names), *extra])
    return (
        f"Workload `{workload}`; one node alone, {STEPS} steps: held-out MSE {single:.4f}.\n\n"
        + markdown_table(header, table)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 nodes only, and write nothing")
    parser.add_argument(
        "--arms", default=",".join(arms(2)), help="which arms, comma-separated (all by default)"
    )
    parser.add_argument("--nodes", default="2,4,8", help="node counts of the study workload (--quick: 2)")
    parser.add_argument(
        "--rounds", default=",".join(map(str, ROUND_IN_SYNCS)), help="round lengths in H steps"
    )
    parser.add_argument("--workloads", default="study,s3", help="study (2, 4, 8 nodes) and/or s3 (2 nodes)")
    parser.add_argument(
        "--cells",
        type=Path,
        help="a JSON-lines file of finished cells: read back, and each new cell appended (resume)",
    )
    args = parser.parse_args()
    chosen, workloads = args.arms.split(","), args.workloads.split(",")
    if unknown := set(chosen) - set(arms(2)):
        parser.error(f"--arms: no arm named {sorted(unknown)}; choose from {', '.join(arms(2))}")
    if unknown := set(workloads) - set(WORKLOADS):
        parser.error(f"--workloads: no workload named {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    torch.set_num_threads(1)
    rounds, bodies, rows = tuple(float(r) for r in args.rounds.split(",")), [], []
    for workload in workloads:
        single = alone(workload=workload)
        print(f"{workload}: one node alone: {single:.4f}")
        nodes = [2] if args.quick or workload == "s3" else [int(n) for n in args.nodes.split(",")]
        rows += study(nodes, rounds, chosen, workload, args.cells)
        bodies.append(report(rows, workload, single))
        print(bodies[-1])
    whole = (
        args.nodes == "2,4,8"
        and chosen == list(arms(2))
        and args.rounds == ",".join(map(str, ROUND_IN_SYNCS))
    )
    if (
        not args.quick and whole and workloads == list(WORKLOADS)
    ):  # only the whole study goes into the document
        plot(rows, alone())
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        body = (
            "\n\n".join(bodies)
            + f"\n\nLoad average at the end (1, 5, 15 min): {load}; simulated times do not depend on it."
        )
        write_section("decoupled-study", "Decoupled DiLoCo: the default against the barrier (simulator)",
                      body + "\n\n![held-out loss against nodes](decoupled_study.png)\n")  # fmt: skip


if __name__ == "__main__":
    main()
