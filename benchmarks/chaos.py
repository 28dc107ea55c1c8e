"""Chaos benchmark: four learner processes train one model while nodes are SIGKILLed (the leader among
them), restarted under the same node id, and join late, and about 10% of their requests to the store fail.

    python benchmarks/chaos.py [--schedules 20] [--store dir|s3|both] [--seed 0] [--steps 500]

Each schedule is seeded (chaos_schedule.py); after it, chaos_checks.py reads the store and the learners'
logs and checks the run. The S3 runs talk to moto's server on 127.0.0.1, started here. Writes its
figures into docs/BENCHMARKS.md; tests/chaos/test_chaos.py runs the same code in small form.
"""

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import slowlink as sl
from slowlink.mailbox.s3 import S3Mailbox

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # for tests/s3server.py
from _report import markdown_table, write_section  # noqa: E402
from chaos_checks import KNOWN_BUGS, Outcome, check, known_bug  # noqa: E402
from chaos_schedule import Conductor, Schedule, make_schedule  # noqa: E402

FRAGMENTS = 2
LEASE_SECONDS = 3.0
# Decoupled DiLoCo over two fragments: a round closes once one contribution is in and the grace window
# has passed, so a killed node never holds a round up; only the leader's death stalls commits, for a lease.
ALGORITHM = {"sync_every": 20, "fragments": FRAGMENTS, "quorum_size": 1, "outer_lr": 0.7, "outer_momentum": 0.9,
             "flush_on_close": True}  # fmt: skip
SESSION = {"lease_seconds": LEASE_SECONDS, "poll_seconds": 0.1, "close_timeout": 10.0}
# About 10% of requests fail: 6% at once (half of the failed writes after the store applied them), 2% after
# a 0.25 s timeout, and 2% of GET answers come back cut short.
FAULTS = {"error_rate": 0.06, "timeout_rate": 0.02, "partial_rate": 0.02, "timeout": 0.25}
BATCH = 2


def run_schedule(schedule: Schedule, store: str, folder: Path, *, steps: int, endpoint=None) -> Outcome:
    """Play `schedule` on a fresh run in `store` ("dir", or "s3" at `endpoint`) and check it."""
    if store == "dir":
        spec = {"kind": "dir", "path": str(folder / "store")}
        mailbox = sl.DirMailbox(spec["path"])
    else:
        spec = {"kind": "s3", "bucket": endpoint.bucket, "prefix": f"chaos/{uuid.uuid4().hex}",
                "endpoint_url": endpoint.url}  # fmt: skip
        mailbox = S3Mailbox(spec["bucket"], spec["prefix"], endpoint_url=spec["endpoint_url"])
    worker_args = {"seed": schedule.seed, "steps": steps, "batch": BATCH, "faults": FAULTS,
                   "algorithm": ALGORITHM, "session": SESSION}  # fmt: skip
    conductor = Conductor(schedule, spec, mailbox, folder, worker_args, FRAGMENTS)
    try:
        played = conductor.play()
    finally:
        conductor.stop_all()
    outcome = check(played, mailbox, fragments=FRAGMENTS, steps=steps)
    if store == "s3":
        mailbox.delete([listing.key for listing in mailbox.list("")])  # moto holds everything in memory
    return outcome


def row(seed: int, store: str, o: Outcome) -> list:
    faults = sum(o.faults_finished.values())
    return [seed, store, f"{o.kills} ({o.leader_kills})", o.restarts, o.joins,
            f"{faults} + ≥{sum(o.faults_killed.values())}", o.rounds, f"{o.stall:.1f}",
            f"{max(o.takeovers):.1f}" if o.takeovers else "-",
            f"{o.lost_finished} + {o.lost_killed}", f"{o.requests / max(1, o.rounds):.0f}",
            f"{o.loss_initial:.2f} → {o.loss_final:.2f}", f"{o.seconds:.0f}",
            "pass" if not o.failures else f"FAIL ({len(o.failures)})"]  # fmt: skip


HEADER = ["seed", "store", "kills (leader)", "restarts", "late joins", "faults injected", "rounds",
          "longest stall s", "new leader after kill s", "work lost", "requests / round", "held-out loss", "wall s", "checks"]  # fmt: skip


def summary(results: list[tuple[int, str, Outcome]]) -> str:
    outcomes = [o for _, _, o in results]
    passed = [o for o in outcomes if not o.failures]
    finished, killed = Counter(), Counter()
    for o in outcomes:
        finished.update(o.faults_finished)
        killed.update(o.faults_killed)
    rounds = sum(o.rounds for o in outcomes)
    takeovers = [seconds for o in outcomes for seconds in o.takeovers]
    worst = max(results, key=lambda result: result[2].stall)
    kinds = ", ".join(f"{kind} {finished[kind] + killed[kind]}" for kind in sorted(finished | killed))
    return "\n".join([
        f"- schedules: {len(outcomes)}, passing every check: {len(passed)}",
        f"- kills survived: {sum(o.kills for o in outcomes if o.survived)} of {sum(o.kills for o in outcomes)} "
        f"({sum(o.leader_kills for o in outcomes)} of the leader), restarts {sum(o.restarts for o in outcomes)}, "
        f"late joins {sum(o.joins for o in outcomes)}",
        f"- faults injected: {sum(finished.values())} reported by the lives that exited, and at least "
        f"{sum(killed.values())} more by killed lives (their last progress line; a killed process cannot "
        f"report its end): {kinds}",
        f"- rounds committed: {rounds}; requests per round under faults: "
        f"{sum(o.requests for o in outcomes) / max(1, rounds):.0f} (every node's requests, faulted ones included)",
        f"- longest stall: {worst[2].stall:.1f} s (seed {worst[0]}, {worst[1]}): {worst[2].stall_cause}",
        f"- a new leader after a leader's kill (lease {LEASE_SECONDS} s; a restarted node takes its own "
        f"leadership back at once): median {statistics.median(takeovers):.1f} s, longest {max(takeovers):.1f} s "
        f"over {len(takeovers)} leader kills" if takeovers else "- no leader kill fired",
        f"- work lost: {sum(o.lost_finished for o in outcomes)} fragment-steps of lives that exited (reported "
        f"unmerged, or unconfirmed and in no commit since), {sum(o.lost_killed for o in outcomes)} trained by "
        "killed lives after their last merged contribution",
    ])  # fmt: skip


def report(results: list[tuple[int, str, Outcome]], steps: int) -> str:
    rows = [row(seed, store, o) for seed, store, o in results]
    stalls = [f"- seed {seed} ({store}), {o.stall:.1f} s: {o.stall_cause}" for seed, store, o in results]
    failures = [f"- seed {seed} ({store}): {failure}" + (" (known bug)" if known_bug(failure) else "")
                for seed, store, o in results for failure in o.failures]  # fmt: skip
    bugs = [f'- "{phrase}": {bug}' for phrase, bug in KNOWN_BUGS.items()]
    notes = [f"- seed {seed} ({store}): {note}" for seed, store, o in results for note in o.notes]
    return f"""Four learner processes (the demo's tiny GPT, one thread each, batch {BATCH}, {steps} steps a life) train
one model over a DirMailbox and over S3 (moto's server on 127.0.0.1), each learner's store wrapped in
`Faulty({", ".join(f"{k}={v}" for k, v in FAULTS.items())})`: about 10% of requests fail, half of the failed
writes after the store applied them. `DiLoCo({", ".join(f"{k}={v}" for k, v in ALGORITHM.items())})`,
`Session(lease_seconds={LEASE_SECONDS}, poll_seconds={SESSION["poll_seconds"]}, close_timeout={SESSION["close_timeout"]})`.
Each seeded schedule starts two or three nodes, joins the others late, and SIGKILLs two or three running
nodes (at least one of them the leader named in leader.json) between 5% and 60% of the way through the
first nodes' steps; most are restarted under the same node id, some within the lease and some after it.

Checks after each schedule, from the store and the learners' logs: every life not killed exited 0 after
its steps; each fragment's commits run 1..n unbroken; every contributor of a commit logged sending that
contribution (paired by payload sha), none is counted twice, and no node was told that a merged
contribution missed its round; every life that exited accounts for each fragment-step it trained
(merged while it ran, or reported in `steps_dropped` or `steps_unconfirmed`); `sl.align` loads each
fragment's newest commit, and that model is finite with a held-out loss below the initial model's.

Faults: reported by the lives that exited + at least those of killed lives. Work lost, in fragment-steps
(a step counts once per fragment): of lives that exited (reported unmerged, or unconfirmed and in no
commit since) + trained by killed lives after their last merged contribution. Requests per round: all
nodes' requests, faulted ones included, over the rounds committed.

{markdown_table(HEADER, rows)}

### Totals

{summary(results)}

### Failures

{chr(10).join(failures) or "None."}

Bugs known in src/slowlink, by a phrase of the failures they cause (benchmarks/chaos_checks.py):
{chr(10).join(bugs) or "none at present."}

### Longest stall of each schedule, and what happened in it

{chr(10).join(stalls)}
""" + (f"\n### Notes\n\n{chr(10).join(notes)}\n" if notes else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=20, help="schedules per store")
    parser.add_argument("--store", choices=["dir", "s3", "both"], default="both")
    parser.add_argument("--seed", type=int, default=0, help="the first schedule's seed")
    parser.add_argument("--steps", type=int, default=500, help="training steps of each learner's life")
    args = parser.parse_args()
    stores = ["dir", "s3"] if args.store == "both" else [args.store]
    results = []
    with ExitStack() as stack:
        endpoint = None
        if "s3" in stores:
            from tests.s3server import open_s3_endpoint

            endpoint = stack.enter_context(open_s3_endpoint())
        print(" | ".join(HEADER), flush=True)
        for store in stores:
            for seed in range(args.seed, args.seed + args.schedules):
                folder = Path(tempfile.mkdtemp(prefix=f"slowlink-chaos-{store}-{seed}-"))
                schedule = make_schedule(seed, lease_seconds=LEASE_SECONDS)
                outcome = run_schedule(schedule, store, folder, steps=args.steps, endpoint=endpoint)
                results.append((seed, store, outcome))
                print(" | ".join(str(cell) for cell in row(seed, store, outcome)), flush=True)
                for failure in outcome.failures:
                    print(f"    FAIL: {failure}", flush=True)
                if not outcome.failures:
                    shutil.rmtree(folder, ignore_errors=True)  # a failing schedule's logs stay for a look
                else:
                    print(f"    logs: {folder}", flush=True)
    body = report(results, args.steps)
    print(body)
    write_section("chaos", "Chaos: kills, restarts, late joins and faults", body)
    if any(o.failures or math.isnan(o.loss_final) for _, _, o in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
