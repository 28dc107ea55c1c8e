"""What a sync step costs the training thread on a 100M-parameter model, and what the whole loop costs.

    python benchmarks/sync_step.py                 # a MemoryMailbox and a DirMailbox, about four minutes

A stack of Linear layers (100.7M float32 parameters), `DiLoCo(sync_every=16, fragments=8)`: one fragment
(12.6M parameters, 50 MB) is due every second step. Each step's compute is a 50 ms sleep, standing for a
step that runs on an accelerator while the host thread waits (the CPU stays free for the communication
thread, as it is beside a GPU). Measured:
- the training thread's time in session.step() on sync steps (those that published a contribution) and on
  steps that applied a commit, against a bare device-side clone of one fragment (`adapter.clone`);
- the loop's wall time, first step to last, against the same loop without slowlink, in paired runs
  (plain, session, plain, session, ...), so that the machine's load weighs on both alike.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import slowlink as sl

sys.path.insert(0, str(Path(__file__).parent))
from _report import markdown_table, write_section  # noqa: E402

WIDTH, LAYERS = 2048, 24  # 24 · (2048² + 2048) = 100.7M parameters
SYNC_EVERY, FRAGMENTS = 16, 8
COMPUTE_SECONDS = 0.05


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def clone_ms(session: sl.Session, repeats: int = 20, *, held: bool = False) -> float:
    """Median time of a device-side clone of one fragment into new memory (the issue's yardstick), or with
    `held` into the node's held buffers (engine/clones.py), as a sync step clones: a copy without page faults,
    as a clone costs on a GPU, whose allocator keeps its memory."""
    timings = []
    for i in range(repeats):
        fragment = i % len(session.plan)
        names = session.plan[fragment]
        into = session.node.clones.take(fragment) if held else None
        started = time.perf_counter()
        session.adapter.clone(names, into=into)
        timings.append(time.perf_counter() - started)
        session.node.clones.release(keep=lambda q: False)
    return statistics.median(timings) * 1000


def nudge(net: torch.nn.Module, step: int) -> None:
    """A stand-in for the optimizer's change, so that every Δ differs: one parameter shifted a little."""
    with torch.no_grad():
        net[step % LAYERS].bias.add_(1e-3)


def plain_loop(steps: int) -> float:
    net = model()
    started = time.perf_counter()
    for step in range(steps):
        time.sleep(COMPUTE_SECONDS)
        nudge(net, step)
    return time.perf_counter() - started


def session_loop(steps: int, mailbox: object) -> dict:
    net, events = model(), []
    algorithm = sl.DiLoCo(sync_every=SYNC_EVERY, fragments=FRAGMENTS)
    # close_timeout: rounds still in flight at the end are not waited for long (leaving is not measured)
    with sl.Session(net, algorithm=algorithm, mailbox=mailbox, node_id="bench", poll_seconds=0.05,
                    close_timeout=5.0, on_event=events.append) as session:  # fmt: skip
        step_seconds, applied_at = [], set()
        started = time.perf_counter()
        for step in range(steps):
            time.sleep(COMPUTE_SECONDS)
            nudge(net, step)
            seen = len(events)
            before = time.perf_counter()
            session.step(samples=16)
            step_seconds.append(time.perf_counter() - before)
            if any(e.kind == "commit_applied" for e in events[seen:]):  # emitted on this thread, in step()
                applied_at.add(step + 1)
        wall = time.perf_counter() - started
        events_in_loop = len(events)
        fragment_mb = session.run.fragment_bytes(0) / 1e6
    clone = clone_ms(session)  # once the communication thread has stopped: the clone alone
    held = clone_ms(session, held=True)
    published = {e.data["step"] for e in events if e.kind == "contribution_sent"}
    return {
        "wall": wall,
        "in_step": sum(step_seconds),
        "clone_ms": clone,
        "held_ms": held,
        "fragment_mb": fragment_mb,
        "published": [step_seconds[s - 1] * 1000 for s in sorted(published) if s <= steps],
        "applied": [step_seconds[s - 1] * 1000 for s in sorted(applied_at - published)],
        "merged": session.stats.rounds_merged,
        "deferred": sum(e.kind == "sync_deferred" for e in events),
        "applied_in_loop": sum(e.kind == "commit_applied" for e in events[:events_in_loop]),
    }


def median(timings: list[float]) -> float:
    return statistics.median(timings) if timings else float("nan")


def slowest_ten(timings: list[float]) -> float:
    return median(sorted(timings)[-10:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--pairs", type=int, default=1, help="paired plain/session runs per mailbox")
    parser.add_argument("--mailboxes", default="memory,dir")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md")
    args = parser.parse_args()
    params = sum(p.numel() for p in model().parameters())
    load_at_start = os.getloadavg()[0]
    rows, loop_rows = [], []
    for kind in args.mailboxes.split(","):
        plains, runs = [], []
        for _ in range(args.pairs):
            plains.append(plain_loop(args.steps))
            with tempfile.TemporaryDirectory() as folder:
                mailbox = sl.MemoryMailbox() if kind == "memory" else sl.DirMailbox(folder)
                runs.append(session_loop(args.steps, mailbox))
            run = runs[-1]
            print(f"{kind}: plain {plains[-1]:.2f} s, session {run['wall']:.2f} s, clone {run['clone_ms']:.1f} ms, "
                  f"into held buffers {run['held_ms']:.1f} ms, "
                  f"sync median {median(run['published']):.1f} ms, slowest ten "
                  f"{slowest_ten(run['published']):.1f} ms, apply median {median(run['applied']):.1f} ms, "
                  f"rounds merged {run['merged']}, deferred {run['deferred']}", flush=True)  # fmt: skip
        clone = statistics.median(run["clone_ms"] for run in runs)
        held = statistics.median(run["held_ms"] for run in runs)
        published = [t for run in runs for t in run["published"]]
        applied = [t for run in runs for t in run["applied"]]
        for what, timings in (("published a contribution", published), ("applied a commit", applied)):
            middle, slow = median(timings), slowest_ten(timings)
            rows.append([kind, what, len(timings), f"{middle:.1f} ms", f"{slow:.1f} ms", f"{clone:.1f} ms",
                         f"{held:.1f} ms", f"{middle / clone:.2f}×", f"{slow / clone:.2f}×"])  # fmt: skip
        ratios = [run["wall"] / plain for run, plain in zip(runs, plains, strict=True)]
        loop_rows.append([kind, f"{statistics.median(plains):.2f} s", f"{statistics.median(r['wall'] for r in runs):.2f} s",
                          ", ".join(f"{100 * (r - 1):+.1f}%" for r in ratios),
                          ", ".join(f"{r['in_step']:.2f} s" for r in runs),
                          sum(r["merged"] for r in runs), sum(r["deferred"] for r in runs)])  # fmt: skip
    load = os.getloadavg()[0]
    body = f"""A stack of {LAYERS} Linear layers of {WIDTH}×{WIDTH} ({params / 1e6:.1f}M float32 parameters),
`DiLoCo(sync_every={SYNC_EVERY}, fragments={FRAGMENTS})` (a fragment of {runs[0]["fragment_mb"]:.0f} MB due every
second step), one node that also merges, {args.steps} steps of {COMPUTE_SECONDS * 1000:.0f} ms compute each: a
sleep standing for a step that runs on an accelerator while the host waits. On this machine the device is the
CPU: the node's anchors, Δ and its encoding (F32 here) are torch tensors and ops there, as on a GPU.
{args.pairs} paired runs per mailbox; load average {load_at_start:.1f} on {os.cpu_count()} cores when it started,
{load:.1f} when it finished (the machine is shared: a run's medians move up to 5× from one run to the next).

The training thread's time in `session.step()` on the steps that did something, against a bare device-side
clone of one fragment into new memory (`adapter.clone`); target: at most 3×. A sync step clones into
buffers the node made when it joined (engine/clones.py), so it pays no page faults; "copy into held buffers"
is that copy alone, the least a sync step can cost. A step that applies a commit adds
θ ← θ + (Θ_new − Θ_old + Δ): about three passes over the fragment on a CPU, kernels queued on a GPU.

{markdown_table(["mailbox", "steps that", "count", "median", "median of slowest ten", "clone", "copy into held buffers", "median / clone", "slowest ten / clone"], rows)}

The loop's wall time from its first step to its last (the Session's start and close left out), against the
same loop without slowlink, one ratio per pair; target: within 3%.

{markdown_table(["mailbox", "plain loop", "with slowlink", "extra, per pair", "in step(), per pair", "rounds merged", "syncs deferred"], loop_rows)}

The extra time outside `session.step()` is the training thread waiting for a core and for Python's interpreter
lock while the communication thread encodes, hashes, merges and commits 50 MB fragments: on 2 shared cores it
cannot keep up with a fragment every 100 ms, so most syncs are deferred (their steps kept for the next one) and
few commits arrive during the loop.
"""
    print(body)
    if not args.no_write:
        write_section("sync-step", "A sync step on a 100M-parameter model", body)


if __name__ == "__main__":
    main()
