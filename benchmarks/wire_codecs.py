"""Wire encodings: single-thread encode and decode speed beside a plain copy, and bytes and error per
format, with and without zstd, on a real model delta. Writes the "wire" section of docs/BENCHMARKS.md.

    python benchmarks/wire_codecs.py [--values 16777216] [--rounds 11]
"""

import os

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"  # one thread, set before numpy and torch load

import argparse  # noqa: E402
import sysconfig  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from slowlink.wire import payload  # noqa: E402
from slowlink.wire.compress import compress, decompress  # noqa: E402
from slowlink.wire.encodings import ENCODINGS  # noqa: E402

try:
    from _report import markdown_table, write_section
except ImportError:  # run as a module from the repository root
    from benchmarks._report import markdown_table, write_section

FORMATS = ["F32", "F16", "BF16", "F8_E4M3", "F8_E4M3_TENSOR", "F4"]


def best_seconds(action, rounds: int) -> float:
    """The least CPU time of `rounds` runs: on a shared machine, waiting for a core is not our time."""
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        action()
        best = min(best, time.thread_time() - start)
    return best


def speed_rows(size: int, rounds: int) -> list[list[object]]:
    values = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    encoded = {name: ENCODINGS[name].encode(values) for name in FORMATS}
    actions = {("copy", ""): values.copy}
    for name in FORMATS:
        codec = ENCODINGS[name]
        actions[name, "encode"] = lambda codec=codec: codec.encode(values)
        actions[name, "decode"] = lambda codec=codec, name=name: codec.decode(encoded[name], values.shape)
    # Rounds interleave the actions, so a busy spell on a shared machine slows all of them alike.
    seconds = dict.fromkeys(actions, float("inf"))
    for _ in range(rounds):
        for key, action in actions.items():
            seconds[key] = min(seconds[key], best_seconds(action, 1))
    megabytes, copy = values.nbytes / 1e6, seconds["copy", ""]
    rows = [["numpy copy", f"{megabytes / copy:,.0f}", "", "1.0"]]
    for name in FORMATS:
        encode, decode = seconds[name, "encode"], seconds[name, "decode"]
        view = np.shares_memory(ENCODINGS[name].decode(encoded[name], values.shape), encoded[name][""])
        decode_speed = "a view, no copy" if view else f"{megabytes / decode:,.0f}"
        rows.append([name, f"{megabytes / encode:,.0f}", decode_speed, f"{(encode + decode) / copy:.1f}"])
    return rows


def corpus_tokens(length: int) -> np.ndarray:
    text = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_bytes()
    return np.frombuffer(text[:length], np.uint8).astype(np.int64)


def model_delta(steps: int = 30) -> dict[str, np.ndarray]:
    """anchor − local of a byte-level transformer (0.8M parameters) after `steps` AdamW steps."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True, norm_first=True)
    model = torch.nn.Sequential(
        torch.nn.Embedding(256, 128),
        torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False),
        torch.nn.Linear(128, 256),
    )
    anchor = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    tokens = torch.from_numpy(corpus_tokens(1 << 16))
    for step in range(steps):
        starts = torch.randint(0, len(tokens) - 65, (8,), generator=torch.Generator().manual_seed(step))
        batch = torch.stack([tokens[s : s + 65] for s in starts])
        mask = torch.nn.Transformer.generate_square_subsequent_mask(64)
        logits = model[2](model[1](model[0](batch[:, :-1]), mask=mask, is_causal=True))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {name: (anchor[name] - p.detach()).numpy() for name, p in model.named_parameters()}


def relative_error(decoded: dict[str, np.ndarray], delta: dict[str, np.ndarray]) -> float:
    error = np.concatenate([(decoded[name] - values).ravel() for name, values in delta.items()])
    return float(np.linalg.norm(error) / np.linalg.norm(np.concatenate([v.ravel() for v in delta.values()])))


SIZE_HEADER = ["format", "bytes", "bytes, zstd", "× smaller", "× smaller, zstd", "rel. L2 error"]
SIZE_HEADER += ["zstd compress / decompress MB/s"]


def size_rows(delta: dict[str, np.ndarray], rounds: int) -> list[list[object]]:
    f32_bytes = len(payload.pack(delta, {}, encoding="F32"))
    rows = []
    for name in FORMATS:
        plain = payload.pack(delta, {}, encoding=name)
        frame = compress(plain)
        error = relative_error(payload.unpack(frame, max_bytes=len(plain))[0], delta)
        seconds = best_seconds(lambda plain=plain: compress(plain), rounds)
        back = best_seconds(lambda frame=frame, plain=plain: decompress(frame, len(plain)), rounds)
        rows.append([
            name, f"{len(plain):,}", f"{len(frame):,}", f"{f32_bytes / len(plain):.2f}",
            f"{f32_bytes / len(frame):.2f}", f"{error:.2e}",
            f"{len(plain) / seconds / 1e6:,.0f} / {len(plain) / back / 1e6:,.0f}",
        ])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=1 << 24)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    speed = markdown_table(
        ["format", "encode MB/s", "decode MB/s", "(encode + decode) / copy"],
        speed_rows(args.values, args.rounds),
    )
    delta = model_delta()
    count = sum(values.size for values in delta.values())
    sizes = markdown_table(SIZE_HEADER, size_rows(delta, args.rounds))
    body = (
        f"Speed on {args.values:,} standard-normal float32 values ({args.values * 4 / 1e6:.0f} MB), one "
        f"thread, in MB/s of float32 input, from the least CPU time of {args.rounds} interleaved runs (the "
        f"machine is shared: waiting for a core is not counted). The last column is encode plus decode "
        f"time over the time of `values.copy()`, which allocates its output as the codecs do.\n\n{speed}\n\n"
        f"Bytes and error on a real pseudo-gradient: a byte-level transformer ({count:,} parameters, "
        f"{len(delta)} tensors) after 30 AdamW steps on argparse.py. Payloads as `payload.pack` writes "
        f"them, header included; zstd is `compress.compress` at level 3 with the byte shuffle; "
        f"'× smaller' is against the plain F32 payload; zstd speeds are in MB/s of the plain payload."
        f"\n\n{sizes}"
    )
    print(body)
    write_section("wire", "Wire encodings", body)


if __name__ == "__main__":
    main()
