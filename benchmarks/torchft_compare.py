"""torchft's DiLoCo against slowlink's DiLoCo over a process group (sl.collective.AllReduce): the same model,
the same inner loop, two ranks on gloo over 127.0.0.1; time per outer step and bytes per outer step.

    python benchmarks/torchft_compare.py --torchft-python /tmp/tft/bin/python

torchft runs in its own virtual environment (it pins its own torch): `python -m venv /tmp/tft &&
/tmp/tft/bin/pip install torch==2.13.0 numpy torchft==0.2.0` (the CPU wheel of torch where the index has it). Each side is two processes; torchft's also has its lighthouse, as its tests run it.
Bytes are what each rank sends per outer step: the pseudo-gradients' all-reduce, float32, by a ring's share
2(N − 1)/N of the buffer, and for torchft also what its replicas send the lighthouse (counted by a relay).
The arms take turns (slowlink, torchft, slowlink 8-bit, again), so a busy machine slows them alike; each
turn of slowlink is also paired with the torchft turn that follows it. Writes its section of
docs/BENCHMARKS.md, with the machine's load average before and after.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(Path(__file__).parent))
WIDTH, H, OUTER, BATCH = 512, 20, 11, 8


def build_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.ReLU(), torch.nn.Linear(2 * WIDTH, WIDTH)
    )


def inner_step(model, optimizer, generator) -> None:
    import torch

    x = torch.randn(BATCH, WIDTH, generator=generator)
    loss = (model(x) - x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def ours(rank: int, port: int, bits: int | None = None) -> dict:
    import torch
    import torch.distributed as dist

    import slowlink as sl

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model, generator = build_model(), torch.Generator().manual_seed(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    method = sl.DiLoCo(sync_every=H, quorum_size=2, overlap_steps=0, outer_lr=0.7, outer_momentum=0.9)
    with sl.Session(
        model, algorithm=method, mailbox=sl.collective.AllReduce(bits=bits), node_id=f"rank-{rank}"
    ) as session:
        for _ in range(H):  # the first outer step warms up; the timed ones follow
            inner_step(model, optimizer, generator)
            session.step(samples=BATCH)
        sent, steps = session.courier.bytes_sent, []
        for _ in range((OUTER - 1) * H):
            start = time.perf_counter()
            inner_step(model, optimizer, generator)
            session.step(samples=BATCH)
            steps.append(time.perf_counter() - start)
        sent = session.courier.bytes_sent - sent
    dist.destroy_process_group()
    return summary(steps) | {"bytes_per_outer_step": sent / (OUTER - 1)}


def summary(steps: list[float]) -> dict:
    """Seconds per outer step, and what the sync adds to them: in each outer step's H steps the sync step is
    the slowest, and it adds its time less a typical step's (the median)."""
    typical = statistics.median(steps)
    windows = [steps[at : at + H] for at in range(0, len(steps), H)]
    return {
        "seconds_per_outer_step": sum(steps) / len(windows),
        "sync_seconds_per_outer_step": statistics.mean(max(window) - typical for window in windows),
    }


def theirs_replica(replica: int, lighthouse: str, out) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torchft.local_sgd import DiLoCo
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    store = dist.TCPStore(host_name="localhost", port=0, is_master=True, wait_for_workers=False)
    model, generator = build_model(), torch.Generator().manual_seed(replica)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    manager = Manager(
        pg=ProcessGroupGloo(), min_replica_size=2, use_async_quorum=False, load_state_dict=model.load_state_dict,
        state_dict=model.state_dict, replica_id=str(replica), store_addr="localhost", store_port=store.port,
        rank=0, world_size=1, lighthouse_addr=lighthouse, port=19630 + replica,
        timeout=timedelta(seconds=60), quorum_timeout=timedelta(seconds=60), connect_timeout=timedelta(seconds=60),
    )  # fmt: skip
    with DiLoCo(manager, [model], optimizer, outer, sync_every=H) as diloco:
        del diloco
        for _ in range(H):
            inner_step(model, optimizer, generator)
        steps, began = [], time.time()
        for _ in range((OUTER - 1) * H):
            start = time.perf_counter()
            inner_step(model, optimizer, generator)  # the sync runs inside optimizer.step(), every H-th
            steps.append(time.perf_counter() - start)
        window = (began, time.time())
    params = sum(p.numel() for p in model.parameters())
    manager.shutdown(wait=False)
    out.put(
        summary(steps)
        | {"bytes_per_outer_step": params * 4 * 2 * (2 - 1) / 2, "steps": manager.current_step()}
        | {"window": window, "seconds": window[1] - window[0]}
    )


class CountingProxy:
    """A TCP relay between torchft's replicas and its lighthouse that counts the bytes the replicas send it
    (quorum requests and heartbeats), with the time of each, so that a timed window's share can be read."""

    def __init__(self, target_port: int) -> None:
        import threading

        self.target, self.sent, self.lock = target_port, [], threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            client, _ = self.server.accept()
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source, sink, counted: bool) -> None:
        while data := source.recv(1 << 16):
            if counted:
                with self.lock:
                    self.sent.append((time.time(), len(data)))
            sink.sendall(data)

    def between(self, start: float, stop: float) -> int:
        with self.lock:
            return sum(size for at, size in self.sent if start <= at <= stop)


def theirs() -> dict:
    import multiprocessing

    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2)
    proxy = CountingProxy(int(lighthouse.address().rsplit(":", 1)[1]))
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    address = f"http://127.0.0.1:{proxy.port}"
    replicas = [context.Process(target=theirs_replica, args=(r, address, out)) for r in range(2)]
    for replica in replicas:
        replica.start()
    results = [out.get(timeout=600) for _ in replicas]
    for replica in replicas:
        replica.join()
    lighthouse.shutdown()
    # What the replicas sent the lighthouse while both timed their outer steps, per replica and outer step.
    start, stop = max(r["window"][0] for r in results), min(r["window"][1] for r in results)
    rpc = proxy.between(start, stop) / len(results) / ((OUTER - 1) * (stop - start) / results[0]["seconds"])
    return results[0] | {"ranks": results, "rpc_bytes_per_outer_step": rpc}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ours(env: dict, bits: int | None = None) -> dict:
    port, me = free_port(), [sys.executable, __file__, "--side", "ours", "--bits", str(bits or 0), "--port"]
    procs = [
        subprocess.Popen([*me, str(port), "--rank", str(r)], stdout=subprocess.PIPE, env=env)
        for r in range(2)
    ]
    rows = [json.loads(proc.communicate(timeout=600)[0].decode().strip().splitlines()[-1]) for proc in procs]
    return rows[0]


def run_theirs(python: str, env: dict) -> dict:
    found = subprocess.run([python, __file__, "--side", "theirs"], capture_output=True, env=env, timeout=900)
    if found.returncode != 0:
        sys.exit(f"torchft's side failed:\n{found.stderr.decode()[-3000:]}")
    return json.loads(found.stdout.decode().strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torchft-python", default="/tmp/tft/bin/python")
    parser.add_argument("--repeats", type=int, default=3, help="turns of each side; the medians are shown")
    parser.add_argument("--side", choices=["ours", "theirs"], help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--bits", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side is not None:
        print(json.dumps(ours(args.rank, args.port, args.bits or None) if args.side == "ours" else theirs()))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    runs: dict[str, list[dict]] = {"slowlink": [], "torchft": [], "slowlink, 8-bit": []}
    for _ in range(args.repeats):  # the sides take turns, so that a busy machine slows both alike
        runs["slowlink"].append(run_ours(env))
        runs["torchft"].append(run_theirs(args.torchft_python, env))
        runs["slowlink, 8-bit"].append(run_ours(env, bits=8))
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print(report(runs, args.repeats, load_before, load_after))


def report(runs: dict[str, list[dict]], repeats: int, load_before: list[str], load_after: list[str]) -> str:
    """The table of each arm's median turn, the paired ratios, and whether slowlink's float32 arm is at most
    torchft's in time and bytes; written into docs/BENCHMARKS.md and returned."""
    from _report import markdown_table, write_section

    params = WIDTH * 2 * WIDTH * 2 + 3 * WIDTH
    rows, medians = [], {}
    for name, turns in runs.items():  # each arm's median turn: the machine's load varies from turn to turn
        total = statistics.median(turn["seconds_per_outer_step"] for turn in turns)
        sync = statistics.median(turn["sync_seconds_per_outer_step"] for turn in turns)
        medians[name] = (total, sync, turns[0]["bytes_per_outer_step"])
        rows.append([name, f"{total:.3f}", f"{1000 * sync:.1f}", f"{turns[0]['bytes_per_outer_step']:,.0f}"])
    pairs = [
        (ours["seconds_per_outer_step"] / theirs["seconds_per_outer_step"],
         ours["sync_seconds_per_outer_step"] / max(1e-9, theirs["sync_seconds_per_outer_step"]))
        for ours, theirs in zip(runs["slowlink"], runs["torchft"], strict=True)
    ]  # fmt: skip
    time_ratio = statistics.median(total for total, _ in pairs)
    sync_ratio = statistics.median(sync for _, sync in pairs)
    ours, theirs = medians["slowlink"], medians["torchft"]
    rpc = statistics.median(turn["rpc_bytes_per_outer_step"] for turn in runs["torchft"])
    all_theirs = theirs[2] + rpc  # slowlink's channel sends nothing but its all-reduce
    met = ours[0] <= theirs[0] and time_ratio <= 1.0
    body = "\n".join([
        f"Same model (an MLP of {params:,} float32 parameters), same inner loop (SGD, batch {BATCH}), H = {H}, outer "
        "Nesterov (lr 0.7, momentum 0.9), 2 processes on gloo over 127.0.0.1, "
        f"{OUTER - 1} timed outer steps after one to warm up; slowlink's `DiLoCo(sync_every={H}, overlap_steps=0, "
        "quorum_size=2)` over `sl.collective.AllReduce()`, torchft 0.2's `DiLoCo(manager, [model], inner, outer, "
        f"sync_every={H})` with its lighthouse and `ProcessGroupGloo`. {repeats} turns of each arm, taken in turn; "
        "each figure the arm's median turn. \"sync\": in each outer step, its slowest step (the sync) less the "
        "median step. Load average (1, 5, 15 min): "
        f"{' '.join(load_before)} before, {' '.join(load_after)} after.",
        "",
        markdown_table(["arm", "s / outer step", "of which sync (ms)", "all-reduce bytes / outer step"], rows),
        "",
        f"- Paired turns (each slowlink turn against the torchft turn after it): time per outer step "
        f"{time_ratio:.2f}× torchft's, the sync {sync_ratio:.2f}× (medians of {repeats} pairs).",
        "- Target \"time and bytes per outer step at most torchft's\": time "
        + ("met" if met else "**not met**")
        + f" ({ours[0]:.3f} s against {theirs[0]:.3f} s); bytes "
        + ("met" if ours[2] <= all_theirs else "**not met**")
        + f": each rank sends {ours[2]:,.0f} bytes per outer step against torchft's {all_theirs:,.0f} "
        f"({theirs[2]:,.0f} in its all-reduce and {rpc:,.0f} to its lighthouse: quorum requests and heartbeats, "
        "counted by a relay between the replicas and the lighthouse during the timed steps).",
        "- All-reduce bytes: the pseudo-gradients' payload each rank sends per outer step by a ring all-reduce's "
        "share 2(N − 1)/N, counted by slowlink's channel and computed for torchft by the same rule. slowlink's "
        "carries 4 bytes more, the round's weight (one float32), so that ranks are weighed by their samples as "
        "over a mailbox; torchft averages equally, by the participant count its lighthouse sends with the "
        "quorum. `AllReduce(bits=8)` gathers 1 byte a value plus a float32 scale per 256.",
    ])  # fmt: skip
    write_section("torchft", "slowlink's DiLoCo over a process group against torchft's", body)
    return body


if __name__ == "__main__":
    main()
