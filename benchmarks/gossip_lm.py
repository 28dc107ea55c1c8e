"""Gossip methods on the demo's byte-level GPT in the simulator: held-out loss per step and per simulated time,
bytes per node per round (blocking and non-blocking), stalls, and the L2 and JS consensus of each round.

    python benchmarks/gossip_lm.py [--size tiny] [--steps 240] [--sync-every 20]   # about 20 minutes on 2 cores

8 workers, batch 8 (TrainWindows, i.i.d., seeded per worker), AdamW lr 1e-3, betas (0.9, 0.95), one torch
thread. One step is 1 s of virtual compute. The bandwidth is chosen so that DiLoCo's blocking all-reduce of
the fp32 model costs 1.78 rounds of compute, the share that gives the paper's 36% utilization at 100 Mbps
(research/algorithms.md §4.5): T_AR = 1.78·H·T_c. Mix1 waits for its values when they come late
(mix1_seconds=3600, the paper's time model); Mix2 of GlobalM1LocalM2 and LocalM1M2 mixes the embeddings and
the first block only (mix2_params), as the paper mixes embeddings, head and first layers. NoLoCo runs H/2
(§8). Every round, once every worker has its start, the 8 starts are evaluated on 32 held-out windows (mean
loss over workers), and their L2 and JS consensus taken (JS on 8 held-out windows).
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

import slowlink as sl
from slowlink import sim
from slowlink.demo.corpus import TrainWindows, heldout_windows, load_corpus
from slowlink.demo.model import build_model, evaluate, loss_on

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import markdown_table, write_section  # noqa: E402
from gossip_definitions import definitions_markdown  # noqa: E402

WORKERS, BATCH = 8, 8
MIX2_PARAMS = r"emb|blocks\.0\."


SMALL_SCALE = """**Where this small scale disagrees with the paper, and why.** (Written for the defaults above; not
recomputed.) Per step, the paper finds the variants within a few percent of DiLoCo in perplexity (GlobalM1
+4%, GlobalM1LocalM2 +0.8% at 10B tokens); here GlobalM1 is 7.5% worse in loss, the Mix2 variants about 3%.
The tiny model trains on batches of 8 windows per worker, so each node's Δ is far noisier relative to its
signal than a 1.5B model's on large batches, and without Mix2 each node applies its own Δ with its own
momentum (μ = 0.9): the noise GlobalM1 leaves unmixed, which its JS disagreement shows (3.2× GlobalM1LocalM2's).
Per simulated time, GlobalM1 and GlobalM1LocalM2 are ahead of DiLoCo early (at 150 s: 2.90 and 3.02 against
3.03 nats; at 200 s: 2.83 and 2.89 against 3.01), GlobalM1LocalM2 is level with DiLoCo through 500 s (2.632
against 2.635) and behind at the end (2.549 at 621 s, its last whole round, against 2.509 at 667 s), and GlobalM1 falls behind after about a third
of the budget: its 1.56× more steps per second do not make up for its per-step loss at this scale. At this
bandwidth (the paper's 100 Mbps share) the all-reduce of starts takes 1.78 rounds, so Mix1 cannot hide behind
a round of compute and GlobalM1 waits out the rest (56% utilization); a Mix2 queues behind that Mix1 on the
link, so GlobalM1LocalM2 reaches 42% (DiLoCo 36%). LocalM1M2 comes out ahead per time: its pairwise Mix1
moves S rather than the ring's 1.75·S and nearly fits in a round (62%), and at this scale its per-step cost is
no larger than GlobalM1LocalM2's. The paper's case against it is the consensus bound (F = 1.75), which the
quadratic below reproduces, not this time model. NoLoCo at H/2 exchanges Δ and slow weights every 10 steps
and blocks the most (25%); per step it is the best, as its paper reports against DiLoCo, and its nodes agree
most closely. L2 against JS: DiLoCo's nodes are identical, so both are exactly 0 for it; between the gossip
variants JS separates GlobalM1 more clearly than L2 (3.2× GlobalM1LocalM2's in JS, 2.4× in L2), and GlobalM1's
JS keeps rising where its loss flattens (the plot)."""


def methods(h: int) -> dict[str, object]:
    common = {"sync_every": h, "mix1_seconds": 3600.0}
    return {
        "DiLoCo": sl.GossipDiLoCo(variant="DiLoCo", **common),
        "GlobalM1": sl.GossipDiLoCo(variant="GlobalM1", **common),
        "GlobalM1LocalM2": sl.GossipDiLoCo(variant="GlobalM1LocalM2", mix2_params=MIX2_PARAMS, **common),
        "LocalM1M2": sl.GossipDiLoCo(variant="LocalM1M2", mix2_params=MIX2_PARAMS, **common),
        "NoLoCo": sl.NoLoCo(sync_every=max(1, h // 2), mix1_seconds=3600.0),
    }


def run_one(name: str, method, size: str, steps: int, bandwidth: float, corpus) -> dict:
    streams = {w: TrainWindows(corpus, node=w, nodes=WORKERS, seed=0) for w in range(WORKERS)}
    held, js_batch = heldout_windows(corpus, 32), heldout_windows(corpus, 8)[:, :-1]
    scratch = [build_model(size) for _ in range(WORKERS)]
    rounds = []

    def on_round(round_: int, starts: list[dict], seconds: float) -> None:
        for model, start in zip(scratch, starts, strict=True):
            model.load_state_dict({k: torch.from_numpy(v) for k, v in start.items()}, strict=False)
        losses = [evaluate(model, held) for model in scratch]
        found = sl.metrics.consensus(scratch, js_batch)
        rounds.append({"round": round_, "seconds": seconds, "loss": float(np.mean(losses)), "l2": found.l2,
                       "js": found.js})  # fmt: skip

    result = sim.run_gossip(
        method, lambda: build_model(size), lambda w, s: (streams[w].next_batch(BATCH),), workers=WORKERS,
        steps=steps, network=sim.Network(bandwidth=bandwidth, exchange="pairwise"), loss=lambda model, batch: loss_on(model, batch[0]),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95)), on_round=on_round,
    )  # fmt: skip
    for row in rounds:
        row["step"] = row["round"] * method.sync_every
    worker = result.workers[0]
    per_round = max(1, worker.rounds)
    return {
        "name": name, "rounds": rounds, "sync_every": method.sync_every, "wall": result.wall_seconds,
        "utilization": float(np.mean([w.utilization for w in result.workers])),
        "blocking_bytes": worker.bytes_sent.get("blocking", 0) / per_round,
        # Starts go out as each round begins, the one after the last round included.
        "non_blocking_bytes": worker.bytes_sent.get("non_blocking", 0) / (per_round + 1),
        "stall_mix1": float(np.mean([w.stall_seconds.get("start", 0.0) for w in result.workers])),
        "stall_mix2": float(np.mean([w.stall_seconds.get("delta", 0.0) for w in result.workers])),
        "self_mixed": sum(sum(w.self_mixed.values()) for w in result.workers),
    }  # fmt: skip


def loss_at(rounds: list[dict], key: str, value: float) -> float:
    """The held-out loss of the last evaluation at or before `value` of `key` (step or seconds)."""
    seen = [r["loss"] for r in rounds if r[key] <= value + 1e-9]
    return seen[-1] if seen else float("nan")


def report(results: list[dict], size: str, steps: int, h: int, bandwidth: float, params: int) -> str:
    shortest = min(r["wall"] for r in results)
    rows = [[r["name"], r["sync_every"], f"{r['rounds'][-1]['loss']:.4f}", f"{loss_at(r['rounds'], 'seconds', shortest):.4f}",
             f"{r['wall']:.0f}", f"{r['utilization']:.0%}", f"{r['blocking_bytes'] / 1e6:.3f}", f"{r['non_blocking_bytes'] / 1e6:.3f}",
             f"{r['stall_mix1']:.0f}", f"{r['stall_mix2']:.0f}", r["self_mixed"],
             f"{np.mean([x['l2'] for x in r['rounds'][1:]]):.2e}", f"{np.mean([x['js'] for x in r['rounds'][1:]]):.2e}"]
            for r in results]  # fmt: skip
    table = markdown_table(
        ["method", "H", f"loss at step {steps}", f"loss at {shortest:.0f} s", "simulated s", "utilization",
         "blocking MB/round", "non-blocking MB/round", "Mix1 stall s", "Mix2 stall s", "left out",
         "mean L2", "mean JS (nats)"], rows)  # fmt: skip
    return (
        f"8 workers of the demo's `{size}` GPT ({params:,} parameters, fp32 on the wire: "
        f"{params * 4 / 1e6:.2f} MB), {steps} steps each, H = {h}, 1 s of compute a step, bandwidth "
        f"{bandwidth / 1e3:.0f} kbit/s (DiLoCo's all-reduce = 1.78 rounds of compute, the paper's 100 Mbps share). "
        "Loss: held-out nats per byte, mean over the 8 workers' round starts. Bytes: per node per round "
        "(NoLoCo's rounds are H/2). Consensus: mean over rounds 1 on of the round starts' L2 (relative) and "
        "generalized JS. Plot: `docs/gossip_lm.png` (per step, per simulated time from the time-matched runs, JS). "
        f"Step-matched runs: `python benchmarks/gossip_lm.py --steps {steps} --sync-every {h}` "
        "(`docs/gossip_lm.json`, about 20 minutes), time-matched ones: the same with `--time-matched` (another 17); "
        "`--from-json` renders this section from the two files.\n\n" + table
    )


def observations(results: list[dict], timed: list[dict] | None = None) -> str:
    """What the tables show, in sentences computed from them (so a rerun keeps them true)."""
    by = {r["name"]: r for r in results}
    if not {"DiLoCo", "GlobalM1", "GlobalM1LocalM2"} <= by.keys():
        return ""
    final = {n: r["rounds"][-1]["loss"] for n, r in by.items()}
    base = final["DiLoCo"]
    per_step = ", ".join(f"{n} {100 * (v - base) / base:+.1f}%" for n, v in final.items() if n != "DiLoCo")
    text = f"Per step, at the last round the variants' held-out loss differs from DiLoCo's by: {per_step}. "
    if timed is not None:
        ends = {r["name"]: r["rounds"][-1]["loss"] for r in timed}
        ahead = [n for n, v in ends.items() if n != "DiLoCo" and v < ends["DiLoCo"]]
        text += (f"Per simulated time (the time-matched table), ahead of DiLoCo at its {timed[0]['wall']:.0f} s: "
                 f"{', '.join(ahead) or 'none'}. ")  # fmt: skip
    mean = lambda r, k: float(np.mean([x[k] for x in r["rounds"][1:]]))  # noqa: E731
    g, gl = by["GlobalM1"], by["GlobalM1LocalM2"]
    return text + (
        "Consensus: DiLoCo's nodes are identical (0 in L2 and JS); "
        f"GlobalM1's disagreement is {mean(g, 'js') / mean(gl, 'js'):.2f}× GlobalM1LocalM2's in JS and "
        f"{mean(g, 'l2') / mean(gl, 'l2'):.2f}× in L2."
    )


def plot(results: list[dict], path: Path, timed: list[dict] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for r in results:
        steps = [x["step"] for x in r["rounds"]]
        axes[0].plot(steps, [x["loss"] for x in r["rounds"]], label=r["name"])
        axes[2].plot(steps[1:], [x["js"] for x in r["rounds"][1:]], label=r["name"])
    for r in timed or results:
        axes[1].plot([x["seconds"] for x in r["rounds"]], [x["loss"] for x in r["rounds"]], label=r["name"])
    axes[0].set(xlabel="step", ylabel="held-out loss (nats)", title="per step")
    axes[1].set(xlabel="simulated seconds", ylabel="held-out loss (nats)", title="per simulated time")
    axes[2].set(xlabel="step", ylabel="JS consensus (nats)", title="disagreement", yscale="log")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def time_matched(results: list[dict], h: int, size: str, bandwidth: float, corpus) -> list[dict]:
    """Every method run for as many whole rounds as fit in the simulated time DiLoCo took for the step-matched
    run (each method's round time, measured there, is the same every round: equal workers, a fixed network)."""
    by = {r["name"]: r for r in results}
    budget, out = by["DiLoCo"]["wall"], [by["DiLoCo"]]
    for name, method in methods(h).items():
        if name == "DiLoCo":
            continue
        done = by[name]
        round_seconds = done["wall"] / (done["rounds"][-1]["round"])
        steps = int(budget // round_seconds) * method.sync_every
        out.append(run_one(name, method, size, steps, bandwidth, corpus))
        print(name, steps, json.dumps({k: v for k, v in out[-1].items() if k != "rounds"}), flush=True)
    return out


def time_table(timed: list[dict]) -> str:
    budget = timed[0]["wall"]
    marks = [round(budget * share / 50) * 50 for share in (0.25, 0.5, 0.75)]
    rows = [[r["name"], r["rounds"][-1]["step"], f"{r['wall']:.0f}"]
            + [f"{loss_at(r['rounds'], 'seconds', mark):.3f}" for mark in marks] + [f"{r['rounds'][-1]['loss']:.4f}"]
            for r in timed]  # fmt: skip
    header = ["method", "steps", "simulated s"] + [f"loss at {m} s" for m in marks] + ["loss at the end"]
    return (
        f"Time-matched (`--time-matched`): each method trains the whole rounds that fit in the {budget:.0f} simulated "
        "seconds DiLoCo took above (`docs/gossip_lm_time.json`); held-out loss of the last round begun by each "
        "simulated time.\n\n" + markdown_table(header, rows)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--sync-every", type=int, default=20)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument(
        "--from-json", action="store_true", help="write the section from docs/gossip_lm*.json"
    )
    parser.add_argument("--time-matched", action="store_true",
                        help="after a step-matched run: run every method for DiLoCo's simulated time")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    corpus = load_corpus()
    params = sum(p.numel() for p in build_model(args.size).parameters())
    # T_AR(S) = 2·(M−1)/M · 8S/W = 1.78·H·T_c  ⇒  W = 2·(M−1)/M · 8S / (1.78·H)
    bandwidth = 2 * (WORKERS - 1) / WORKERS * 8 * params * 4 / (1.78 * args.sync_every)
    out = Path(__file__).resolve().parent.parent / "docs"
    reuse = args.from_json or args.time_matched
    results = json.loads((out / "gossip_lm.json").read_text()) if reuse else []
    for name, method in methods(args.sync_every).items():
        if reuse or (args.only and name not in args.only):
            continue
        results.append(run_one(name, method, args.size, args.steps, bandwidth, corpus))
        print(name, json.dumps({k: v for k, v in results[-1].items() if k != "rounds"}), flush=True)
    (out / "gossip_lm.json").write_text(json.dumps(results, indent=1))
    if args.time_matched:
        timed = time_matched(results, args.sync_every, args.size, bandwidth, corpus)
        (out / "gossip_lm_time.json").write_text(json.dumps(timed, indent=1))
    timed_path = out / "gossip_lm_time.json"
    timed = json.loads(timed_path.read_text()) if timed_path.exists() else None
    plot(results, out / "gossip_lm.png", timed)
    body = report(results, args.size, args.steps, args.sync_every, bandwidth, params)
    if timed is not None:
        body += "\n\n" + time_table(timed)
    body += "\n\n" + observations(results, timed) + "\n\n" + definitions_markdown()
    if args.size == "tiny" and args.steps == 240 and args.sync_every == 20:
        body += "\n\n" + SMALL_SCALE
    print(body)
    write_section("gossip", "Gossip DiLoCo and NoLoCo on the demo GPT, simulated (8 workers)", body)


if __name__ == "__main__":
    main()
