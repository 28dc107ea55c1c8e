"""Requests per scheduled round, and wall time against the plain loop, for two nodes over a real S3 server.

    python benchmarks/s3_requests.py              # moto's S3 server on 127.0.0.1, about a minute on 2 cores

Two processes train a small MLP regression for 400 steps of 20 ms (a real Adam step, then a sleep to the
20 ms) with the defaults of `DiLoCo(sync_every=50, fragments=2)`: 400 / 50 × 2 = 16 scheduled rounds. Every
request either node makes, joining and leaving included, counts; the table breaks them down by verb and
by the kind of key. The plain loop is the same 400 steps without slowlink, in the same kind of process,
run alternately with the pair.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))
from _report import markdown_table, write_section  # noqa: E402

STEPS, SYNC_EVERY, FRAGMENTS, STEP_SECONDS = 400, 50, 2, 0.02
ROUNDS = STEPS // SYNC_EVERY * FRAGMENTS


def train(args: dict, out: str) -> None:
    import torch

    import slowlink as sl

    torch.set_num_threads(1)
    torch.manual_seed(args["node"])
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(100 + args["node"])
    held_out = torch.randn(2048, 8, generator=torch.Generator().manual_seed(99_999))

    def held_out_loss() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(held_out), held_out.sin().sum(1, keepdim=True)))

    def step() -> None:
        started = time.perf_counter()
        x = torch.randn(32, 8, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), x.sin().sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(max(0.0, STEP_SECONDS - (time.perf_counter() - started)))

    if args["plain"]:
        started = time.perf_counter()
        for _ in range(STEPS):
            step()
        Path(out).write_text(json.dumps({"wall": time.perf_counter() - started, "loss": held_out_loss()}))
        return
    mailbox = sl.S3Mailbox(args["bucket"], args["prefix"], endpoint_url=args["url"], region=args["region"])
    options = dict(args.get("options", {}))  # JSON: a merge rule comes by name
    if options.get("merge") == "RDA":
        options["merge"] = sl.RDA()
    algorithm = sl.DiLoCo(sync_every=SYNC_EVERY, fragments=FRAGMENTS, **options)
    # A script builds its model and data after making the mailbox, which makes its S3 client meanwhile
    # (LazyClient, about 0.15 s of CPU); this model builds in a moment, so wait for the client here.
    mailbox._client()
    Path(f"{out}.ready").touch()  # torch and slowlink imported, the model built, the client made
    while not Path(args["go"]).exists():  # both processes start training together
        time.sleep(0.005)
    started = time.perf_counter()
    # Where the training thread's time beyond the steps goes: joining, session.step(), leaving.
    session = sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id=f"node-{args['node']}")
    with session:
        joined, in_step = time.perf_counter(), 0.0
        for _ in range(STEPS):
            step()
            before = time.perf_counter()
            session.step(samples=32)
            in_step += time.perf_counter() - before
        leaving = time.perf_counter()
    wall = time.perf_counter() - started
    spent = {"join": joined - started, "step": in_step, "leave": time.perf_counter() - leaving}
    stats = session.stats
    # After leaving, the node holds the newest commits: the loss is the committed model's.
    Path(out).write_text(json.dumps({"wall": wall, "spent": spent, "counts": dict(session.mailbox.kinds), "merged": stats.rounds_merged,
                                     "applied": stats.commits_applied, "loss": held_out_loss(),
                                     "versions": list(stats.versions)}))  # fmt: skip


def run_pair(endpoint, folder: str, options: dict | None = None) -> list[dict]:
    """Both nodes' results (wall, request counts, the committed model's held-out loss); `options` are more
    keyword arguments of sl.DiLoCo."""
    prefix, go = f"slowlink-bench/{uuid.uuid4().hex}", f"{folder}/go"
    procs = []
    for node in range(2):
        args = {"url": endpoint.url, "bucket": endpoint.bucket, "region": endpoint.region, "prefix": prefix,
                "node": node, "plain": False, "go": go, "options": options or {}}  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--worker", json.dumps(args), f"{folder}/{node}.json"]
            )
        )
    while not all(Path(f"{folder}/{node}.json.ready").exists() for node in range(2)):
        if any(proc.poll() not in (None, 0) for proc in procs):
            raise SystemExit("a worker failed before training")
        time.sleep(0.01)
    Path(go).touch()
    for proc in procs:
        if proc.wait(timeout=600) != 0:
            raise SystemExit(f"a worker failed with exit code {proc.returncode}")
    results = [json.loads(Path(f"{folder}/{node}.json").read_text()) for node in range(2)]
    for path in [go, *(f"{folder}/{node}.json.ready" for node in range(2))]:
        Path(path).unlink()
    return results


def run_plain(folder: str) -> dict:
    """The plain loop alone on node 0's data: its wall and held-out loss."""
    subprocess.run([sys.executable, __file__, "--worker", json.dumps({"node": 0, "plain": True}), f"{folder}/plain.json"],
                   check=True)  # fmt: skip
    return json.loads(Path(f"{folder}/plain.json").read_text())


def main() -> None:
    from tests.s3server import open_s3_endpoint

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md as it is"
    )
    options = parser.parse_args()
    plain_walls, pair_walls, per_round, counts, spent = (
        [],
        [],
        [],
        Counter(),
        {"join": [], "step": [], "leave": []},
    )
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    with open_s3_endpoint() as endpoint, tempfile.TemporaryDirectory() as folder:
        store = "moto on 127.0.0.1" if endpoint.is_moto else endpoint.url
        for _ in range(options.repeats):
            plain_walls.append(run_plain(folder)["wall"])
            results = run_pair(endpoint, folder)
            pair_walls.append(max(result["wall"] for result in results))
            slower = max(results, key=lambda result: result["wall"])
            for part, seconds in slower["spent"].items():
                spent[part].append(seconds)
            total = Counter()
            for result in results:
                total.update(result["counts"])
            counts.update(total)
            per_round.append(sum(total.values()) / ROUNDS)
            for result in results:
                role = "merger" if result["merged"] else "learner"
                print(role, sorted(result["counts"].items(), key=lambda item: -item[1]), flush=True)
            print(f"plain {plain_walls[-1]:.2f} s, pair {pair_walls[-1]:.2f} s, {per_round[-1]:.1f} requests/round, "
                  f"merged {[r['merged'] for r in results]}, applied {[r['applied'] for r in results]}", flush=True)  # fmt: skip
    plain, pair = statistics.median(plain_walls), statistics.median(pair_walls)
    requests = statistics.median(per_round)
    breakdown = [[kind, f"{count / options.repeats / ROUNDS:.2f}"] for kind, count in counts.most_common()]
    summary = (
        f"requests per scheduled round {requests:.1f} (target ≤ 8); wall {pair:.2f} s against {plain:.2f} s "
        f"for the plain loop: {100 * (pair / plain - 1):+.1f}% (target within 3%)"
    )
    waits = ", ".join(f"{part} {statistics.median(seconds):.2f} s" for part, seconds in spent.items())
    summary += f". The slower node's training thread, beyond its steps: {waits} (medians)"
    print(summary)
    print(markdown_table(["request", "per round"], breakdown))
    if options.no_write:
        return
    body = f"""Store: {store}. Two processes, a small MLP regression, {STEPS} steps of {STEP_SECONDS * 1000:.0f} ms (a real Adam
step and a sleep to {STEP_SECONDS * 1000:.0f} ms), `DiLoCo(sync_every={SYNC_EVERY}, fragments={FRAGMENTS})` with its defaults
(quorum 1, no barrier): {ROUNDS} scheduled rounds. Requests of both nodes together, joining and leaving
included, over the scheduled rounds. Wall: the slower node's time from entering `Session` to leaving it,
against the plain loop's {STEPS} steps in the same kind of process. Medians of {options.repeats} runs, alternating.
Load average (1, 5, 15 min) before: {" ".join(load_before)}, after: {" ".join(Path("/proc/loadavg").read_text().split()[:3])}
on 2 cores shared with other work.

{summary}.

{markdown_table(["request", "per round"], breakdown)}
"""
    write_section("s3-requests", "Requests per round over S3, and wall time against the plain loop", body)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        train(json.loads(sys.argv[2]), sys.argv[3])
    else:
        main()
