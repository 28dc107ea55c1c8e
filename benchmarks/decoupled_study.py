"""Decoupled DiLoCo against the barrier and one node alone, in the simulator: held-out loss of the committed
model and simulated wall time, over node counts, speed mixes and store latencies (issue 12).

    python benchmarks/decoupled_study.py           # 2, 4, 8 nodes; about 15 minutes on one core
    python benchmarks/decoupled_study.py --quick   # 2 nodes only; about a minute; writes nothing

The workload: an MLP (16-64-64-1, tanh) regressing a fixed random tanh teacher plus noise, each node on its
own seeded stream of batches of 32, AdamW lr 1e-3, 400 steps of 20 ms (jitter 10%), H = 50, 2 fragments.
The store's request latency is set so that a round (a PUT and a GET) takes 0.2, 1 or 4 times H steps.
Arms: the barrier (standard Streaming DiLoCo, quorum_size=nodes, overlap_steps=0), averaging without a
barrier (outer_lr=1, outer_momentum=0), the first default (adaptive_outer=False and a grace window of a
quarter sync), the default with that window, the default (half a sync), a window of one sync, RDA, and
flush_on_close; and one node alone (a plain loop on node 0's stream). The committed model is the one the last node to leave holds.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

import slowlink as sl
from slowlink import sim

sys.path.insert(0, str(Path(__file__).parent))
from _report import markdown_table, write_section  # noqa: E402

IN, HIDDEN, BATCH, STEPS, STEP_SECONDS, H, FRAGMENTS = 16, 64, 32, 400, 0.02, 50, 2
ROUND_IN_SYNCS = (0.2, 1.0, 4.0)  # a round's PUT + GET, in units of H steps
PLOT = Path(__file__).resolve().parent.parent / "docs" / "decoupled_study.png"


QUARTER_SYNC = (
    0.25 * H * STEP_SECONDS
)  # the grace window before this session: half the steps between fragments


def arms(nodes: int) -> dict[str, sl.DiLoCo]:
    return {
        "barrier": sl.DiLoCo(sync_every=H, fragments=FRAGMENTS, quorum_size=nodes, overlap_steps=0),
        "averaging": sl.DiLoCo(
            sync_every=H, fragments=FRAGMENTS, outer_lr=1.0, outer_momentum=0.0, adaptive_outer=False
        ),  # fmt: skip
        "first default": sl.DiLoCo(
            sync_every=H, fragments=FRAGMENTS, adaptive_outer=False, grace_seconds=QUARTER_SYNC
        ),  # fmt: skip
        "quarter-sync grace": sl.DiLoCo(sync_every=H, fragments=FRAGMENTS, grace_seconds=QUARTER_SYNC),
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


def alone(steps: int = STEPS) -> float:
    """One plain node: node 0's stream, no slowlink."""
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        optimizer.zero_grad()
        mse(model, batches(0, step)).backward()
        optimizer.step()
    return held_out(model)


def simulate(method: sl.DiLoCo, nodes: int, speeds: list[float], round_in_syncs: float) -> dict:
    result = sim.run(method, make_model, batches, loss=mse, workers=nodes, steps=STEPS,
                     step_seconds=[STEP_SECONDS * s for s in speeds], jitter=0.1,
                     network=network(round_in_syncs), seed=0)  # fmt: skip
    last = max(range(nodes), key=lambda i: result.workers[i].wall_seconds)
    fast_wall = min(report.wall_seconds for report in result.workers)
    return {"loss": held_out(result.models[last]), "wall": result.wall_seconds, "fast_wall": fast_wall,
            "commits": len(result.commits), "stalled": max(r.stalled_seconds for r in result.workers)}  # fmt: skip


def study(node_counts: list[int], rounds: tuple[float, ...], chosen: list[str]) -> list[dict]:
    rows = []
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
                    row = {"nodes": nodes, "speeds": mix, "round": round_in_syncs, "arm": arm}
                    row.update(simulate(method, nodes, speeds, round_in_syncs))
                    print(f"{row}  ({time.perf_counter() - started:.1f} s)", flush=True)
                    rows.append(row)
    return rows


def plot(rows: list[dict], single: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(ROUND_IN_SYNCS), figsize=(13, 4), sharey=True)
    colors = {"barrier": "black", "averaging": "tab:green", "first default": "tab:red",
              "quarter-sync grace": "tab:brown", "default": "tab:blue", "grace 1 sync": "tab:cyan",
              "rda": "tab:purple", "flush on close": "tab:orange"}  # fmt: skip
    for axis, round_in_syncs in zip(axes, ROUND_IN_SYNCS, strict=True):
        for arm, color in colors.items():
            for mix, style in (("1:1", "-"), ("1:2", "--")):
                points = [(r["nodes"], r["loss"]) for r in rows
                          if r["arm"] == arm and r["speeds"] == mix and r["round"] == round_in_syncs]  # fmt: skip
                if points:
                    axis.plot(
                        [n for n, _ in points],
                        [loss for _, loss in points],
                        style,
                        marker="o",
                        color=color,
                        label=f"{arm}, speeds {mix}",
                    )
        axis.axhline(single, color="grey", linestyle=":", label="one node alone")
        axis.set(title=f"round = {round_in_syncs:g}·H steps", xlabel="nodes", xscale="log", yscale="log")
        axis.set_xticks([2, 4, 8], ["2", "4", "8"])
    axes[0].set_ylabel("held-out MSE of the committed model")
    axes[-1].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(PLOT, dpi=110)


def report(rows: list[dict], single: float) -> str:
    names = list(dict.fromkeys(r["arm"] for r in rows))
    header = ["nodes", "speeds", "round / H steps", *names, "barrier wall s", "default wall s (fastest node)"]
    table = []
    for key in dict.fromkeys((r["nodes"], r["speeds"], r["round"]) for r in rows):
        by_arm = {r["arm"]: r for r in rows if (r["nodes"], r["speeds"], r["round"]) == key}
        walls = [f"{by_arm['barrier']['wall']:.1f}" if "barrier" in by_arm else "",
                 f"{by_arm['default']['wall']:.1f} ({by_arm['default']['fast_wall']:.1f})" if "default" in by_arm else ""]  # fmt: skip
        table.append([*key, *(f"{by_arm[arm]['loss']:.4f}" for arm in names), *walls])
    return f"One node alone, {STEPS} steps: held-out MSE {single:.4f}.\n\n" + markdown_table(header, table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 nodes only, and write nothing")
    parser.add_argument(
        "--arms", default=",".join(arms(2)), help="which arms, comma-separated (all by default)"
    )
    parser.add_argument("--nodes", default="2,4,8", help="node counts, comma-separated (--quick: 2)")
    parser.add_argument(
        "--rounds", default=",".join(map(str, ROUND_IN_SYNCS)), help="round lengths in H steps"
    )
    args = parser.parse_args()
    chosen = args.arms.split(",")
    if unknown := set(chosen) - set(arms(2)):
        parser.error(f"--arms: no arm named {sorted(unknown)}; choose from {', '.join(arms(2))}")
    torch.set_num_threads(1)
    single = alone()
    print(f"one node alone: {single:.4f}")
    node_counts = [2] if args.quick else [int(n) for n in args.nodes.split(",")]
    rows = study(node_counts, tuple(float(r) for r in args.rounds.split(",")), chosen)
    body = report(rows, single)
    print(body)
    whole = (
        args.nodes == "2,4,8"
        and chosen == list(arms(2))
        and args.rounds == ",".join(map(str, ROUND_IN_SYNCS))
    )
    if not args.quick and whole:  # only the whole study goes into the document
        plot(rows, single)
        write_section("decoupled-study", "Decoupled DiLoCo: the default against the barrier (simulator)",
                      body + "\n\n![held-out loss against nodes](decoupled_study.png)\n")  # fmt: skip


if __name__ == "__main__":
    main()
