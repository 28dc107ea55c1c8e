"""DeMo's compression and decompression on one CPU core, per step and per million parameters, beside a forward
and backward pass of the small language model and beside the floor: the chunked DCT's matrix products.

    python benchmarks/demo_speed.py [--repeats 20] [--workers 4] [--clock cpu|wall]

One thread (torch.set_num_threads(1)), timed by default in that thread's CPU time (time.thread_time): what
"on one CPU core" asks, and what other work on a shared machine disturbs least; --clock wall for
time.perf_counter. The small GPT (research/algorithms.md §8, about 0.8M parameters),
batch 8 of 128 bytes. Compression is DeMo.begin_step (momentum, forward DCT, top-k, values, the inverse of
what was sent, packing); decompression is DeMo.end_step on `workers` payloads, its own and the other
nodes' (each of its own batch): unpacking and checking the others', the sparse average, the inverse DCT, the
sign step. The floor is the transform itself: one forward
and one inverse, two matrix products each over a stack of every tensor's chunks of one shape, which any
DCT-based DeMo step must do.
Each time is the median of the repeats.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import slowlink as sl
from slowlink.algorithms import demo as d
from slowlink.demo.corpus import WINDOW
from slowlink.demo.model import build_model, loss_on

sys.path.insert(0, str(Path(__file__).parent))
from _report import markdown_table, write_section  # noqa: E402


def transforms(params: list[torch.Tensor], chunk: int):
    """The floor: the forward and the inverse transform of every tensor, batched as the step batches them
    (one stack of chunks per chunk shape: algorithms/demo.groups_of), two matrix products each, written into
    buffers made once (a Scratch per group, as the step's): products into fresh tensors cost their page
    faults, which would time the allocator, not the transform."""
    tensors = {str(i): p.detach() for i, p in enumerate(params)}
    groups = d.groups_of(tuple((name, tuple(t.shape)) for name, t in tensors.items()), chunk)
    bases = [d.basis_of(g.layouts[0], "dct", seed=0, step=0, like=params[0]) for g in groups]
    stacks = [d.stack_chunks(tensors, g).contiguous() for g in groups]
    coefficients = [d.forward_blocks(x, b).clone() for x, b in zip(stacks, bases, strict=True)]
    scratch = [d.Scratch() for _ in groups]

    def forward():
        for x, b, work in zip(stacks, bases, scratch, strict=True):
            d.forward_blocks(x, b, work)

    def inverse():
        for c, b, work in zip(coefficients, bases, scratch, strict=True):
            d.inverse_blocks(c, b, work)

    return forward, inverse


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def measure(values: str, topk: int, workers: int, repeats: int, clock=time.thread_time) -> dict[str, float]:
    models = [build_model("small") for _ in range(workers)]  # seeded: every node starts alike
    batches = [
        torch.randint(0, 256, (8, WINDOW), generator=torch.Generator().manual_seed(w)) for w in range(workers)
    ]
    optimizers = [sl.DeMo(list(m.parameters()), 1e-3, topk=topk, values=values) for m in models]

    def forward_backward(node: int):
        models[node].zero_grad()
        loss_on(models[node], batches[node]).backward()

    for node in range(workers):
        forward_backward(node)
    forward, inverse = transforms(list(models[0].parameters()), 64)
    # Interleaved: each repeat times the floor, then node 0's step's two halves (its payload and the others'
    # averaged), then a forward and backward pass, so that the load on a shared machine weighs on all alike.
    # The other nodes' halves (their own payloads, each of its own batch) are not timed.
    times: dict[str, list[float]] = {"floor": [], "begin": [], "end": [], "forward_backward": []}
    for repeat in range(repeats + 1):  # the first warms caches and the allocator
        others = [optimizers[node].begin_step() for node in range(1, workers)]
        marks = [clock()]
        forward(), inverse()
        marks.append(clock())
        rows = [optimizers[0].begin_step(), *others]
        marks.append(clock())
        optimizers[0].end_step(rows)
        marks.append(clock())
        forward_backward(0)
        marks.append(clock())
        for node in range(1, workers):  # (their gradients kept from the start: their momenta still move)
            optimizers[node].end_step(rows)
        if repeat:
            for name, begin, end in zip(times, marks[:-1], marks[1:], strict=True):
                times[name].append(end - begin)
    both = [b + e for b, e in zip(times["begin"], times["end"], strict=True)]
    return {
        "params": sum(p.numel() for p in models[0].parameters()),
        "best": min(both) / min(times["floor"]),
    } | {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for values, topk in (("2bit", 32), ("bf16", 32), ("sign", 8)):
        m = measure(values, topk, args.workers, args.repeats, CLOCKS[args.clock])
        per_million = 1e6 / m["params"]
        both = m["begin"] + m["end"]
        rows.append([f"topk={topk}, values={values}", f"{1e3 * m['begin'] * per_million:.1f}",
                     f"{1e3 * m['end'] * per_million:.1f}", f"{1e3 * both * per_million:.1f}",
                     f"{1e3 * m['floor'] * per_million:.1f}", f"{both / m['floor']:.2f}×", f"{m['best']:.2f}×",
                     f"{1e3 * m['forward_backward'] * per_million:.1f}", f"{both / m['forward_backward']:.2f}"])  # fmt: skip
        print(rows[-1], flush=True)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    body = f"""One CPU thread, the small GPT ({m["params"] / 1e6:.2f}M parameters, batch 8 of 128 bytes), {args.workers}
payloads averaged per step (a node's own and the others', each of its own batch), median of {args.repeats}. Times in ms per step per million parameters,
{"the thread's CPU time" if args.clock == "cpu" else "wall-clock time"} (--clock {args.clock}). The floor
is the transform alone: one chunked DCT forward and one inverse (two batched matrix products each, over
the stack of all chunks of one shape, into buffers made once, as the step's). Target: compression +
decompression within 2× of the floor.
"best / best": the fastest repeat of both halves over the fastest floor (what a loaded machine disturbs least).
Load average while it ran (1, 5, 15 min): {load}.

{markdown_table(["setting", "compress", "decompress", "both", "floor (DCT + IDCT)", "both / floor", "best / best", "forward+backward", "both / fwd+bwd"], rows)}
"""
    print(body)
    write_section("demo2-speed", "DeMo: compression speed on one core", body)


if __name__ == "__main__":
    main()
