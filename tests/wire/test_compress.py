"""Byte-shuffled zstd frames: exact round trips, smaller than plain on real deltas, the documented byte
layout, and refusal of truncated, altered, lying and bomb-like frames."""

import sys
import tracemalloc

import numpy as np
import pytest
import zstandard

from slowlink.errors import ConfigError, PayloadError
from slowlink.wire import payload
from slowlink.wire.compress import MAGIC, compress, decompress, is_compressed


def mlp_delta(steps: int = 20) -> dict[str, np.ndarray]:
    """anchor − local of a 2-layer MLP (33k parameters) after a few Adam steps."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        anchor = {name: p.detach().clone() for name, p in model.named_parameters()}
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(steps):
            inputs = torch.randn(32, 64)
            loss = (model(inputs) - inputs.flip(1)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return {name: (anchor[name] - p.detach()).numpy() for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def delta() -> dict[str, np.ndarray]:
    return mlp_delta()


def header_end(plain: bytes) -> int:
    return 8 + int.from_bytes(plain[:8], "little")


# Compressed / plain size, measured: F32 0.844, F16 0.892, BF16 0.728, F8_E4M3 0.666, F4 0.856.
RATIOS = [("F32", 0.87), ("F16", 0.92), ("BF16", 0.75), ("F8_E4M3", 0.69), ("F4", 0.88)]


@pytest.mark.parametrize(("encoding", "most"), RATIOS)
def test_compressed_real_deltas_round_trip_exactly_and_are_smaller_than_plain(delta, encoding, most):
    plain = payload.pack(delta, {"kind": "delta"}, encoding=encoding)
    frame = compress(plain)
    assert is_compressed(frame) and not is_compressed(plain)
    assert decompress(frame, max_bytes=len(plain)) == plain
    assert len(frame) / len(plain) < most


def test_every_compression_level_round_trips(delta):
    plain = payload.pack(delta, {"kind": "delta"}, encoding="BF16")
    sizes = [len(compress(plain, level=level)) for level in (1, 3, 19)]
    assert all(decompress(compress(plain, level=level), len(plain)) == plain for level in (1, 19))
    assert sizes[2] <= sizes[0]


def test_each_tensors_bytes_are_grouped_by_their_place_in_an_element():
    plain = payload.pack({"w": np.array([1.0, 2.0], np.float32)}, {}, encoding="F32")
    inner = zstandard.ZstdDecompressor().decompress(compress(plain)[len(MAGIC) :])
    end = header_end(plain)
    assert inner[:end] == plain[:end]  # the header as it was
    # 1.0 = 00 00 80 3F and 2.0 = 00 00 00 40, little-endian: byte 0 of both, then byte 1, ...
    assert inner[end:] == bytes([0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x3F, 0x40])
    f16 = payload.pack({"h": np.array([1.0, -2.0], np.float32)}, {}, encoding="F16")
    inner = zstandard.ZstdDecompressor().decompress(compress(f16)[len(MAGIC) :])
    assert inner[header_end(f16) :] == bytes([0x00, 0x00, 0x3C, 0xC0])  # F16 1.0 = 3C00, -2.0 = C000


def test_no_plain_payload_can_start_with_the_frame_marker():
    claimed = int.from_bytes(MAGIC, "little")  # what a reader of a plain payload takes as its header size
    assert claimed > 1 << 59  # 576 PB
    assert not is_compressed(b"") and not is_compressed(MAGIC[:-1])


def test_truncated_frames_raise_payload_error(delta):
    frame = compress(payload.pack(delta, {"kind": "delta"}, encoding="F8_E4M3"))
    for cut in (len(MAGIC), len(MAGIC) + 3, len(MAGIC) + 20, len(frame) // 2, len(frame) - 1):
        with pytest.raises(PayloadError):
            decompress(frame[:cut], max_bytes=1 << 24)


def test_altered_or_extended_frames_raise_payload_error(delta):
    plain = payload.pack(delta, {"kind": "delta"}, encoding="F8_E4M3")
    frame = bytearray(compress(plain))
    rng = np.random.default_rng(0)
    for position in rng.integers(len(MAGIC) + 16, len(frame), 20):
        altered = frame.copy()
        altered[position] ^= 0x10
        with pytest.raises(PayloadError):
            decompress(bytes(altered), max_bytes=1 << 24)
    with pytest.raises(PayloadError, match="unused data"):
        decompress(bytes(frame) + b"\x00", max_bytes=1 << 24)
    with pytest.raises(PayloadError, match="no zstd frame marker"):
        decompress(plain, max_bytes=1 << 24)


def test_a_zstd_bomb_is_refused_before_it_is_expanded():
    # 64 MiB of zeros compress to a few KiB; a reader with a 1 MiB limit must not allocate them.
    bomb = compress(payload.pack({"z": np.zeros(1 << 24, np.float32)}, {}, encoding="F32"))
    assert len(bomb) < 64 << 10
    tracemalloc.start()
    try:
        with pytest.raises(PayloadError, match="would expand to 671090"):
            decompress(bomb, max_bytes=1 << 20)
        with pytest.raises(PayloadError, match="would expand to 671090"):
            payload.unpack(bomb, max_bytes=1 << 20)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


def test_frames_that_lie_about_their_size_or_omit_it_are_refused():
    plain = payload.pack({"w": np.ones(1000, np.float32)}, {}, encoding="F32")
    hidden = zstandard.ZstdCompressor(write_content_size=False).compress(plain)
    with pytest.raises(PayloadError, match="does not declare its size"):
        decompress(MAGIC + hidden, max_bytes=1 << 20)
    # A frame header copied from a smaller payload in front of a larger body.
    small = zstandard.ZstdCompressor().compress(plain[:100])
    large = zstandard.ZstdCompressor().compress(plain)
    header_size = zstandard.frame_header_size(large)
    liar = small[: zstandard.frame_header_size(small)] + large[header_size:]
    with pytest.raises(PayloadError):
        decompress(MAGIC + liar, max_bytes=1 << 20)


def test_a_node_without_zstandard_is_told_which_extra_to_install(monkeypatch):
    plain = payload.pack({"w": np.ones(4, np.float32)}, {}, encoding="F32")
    frame = compress(plain)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ConfigError, match=r"pip install slowlink\[zstd\]"):
        compress(plain)
    with pytest.raises(ConfigError, match=r"pip install slowlink\[zstd\]"):
        decompress(frame, max_bytes=1 << 20)
    assert payload.unpack(plain)[0]["w"].tolist() == [1.0] * 4  # plain payloads need no extra


def test_bytes_that_are_not_safetensors_are_refused_by_compress():
    with pytest.raises(PayloadError, match="truncated"):
        compress(b"abc")
    with pytest.raises(PayloadError, match="not a safetensors header"):
        compress((5).to_bytes(8, "little") + b"nope!")


def test_compress_and_decompress_hold_nothing_whole_beyond_their_input_and_output():
    # 16 MiB of float32 in two tensors that compress little (random mantissas: a 13.7 MiB frame). Besides
    # its input, compress holds its output (grown as zstd writes it) and one shuffled piece of
    # STREAM_BYTES; decompress its output and pieces of STREAM_BYTES. Measured peaks: compress 16.6 MiB,
    # decompress 18.3 MiB (on top of the frame); the code before, which shuffled a whole copy for zstd to
    # take at once, 32.1 MiB in compress, and before that 45.8 and 61.7.
    rng = np.random.default_rng(0)
    arrays = {name: rng.standard_normal(1 << 21).astype(np.float32) for name in ("a", "b")}
    plain = payload.pack(arrays, {"kind": "delta"}, encoding="F32")
    del arrays
    size = len(plain)
    tracemalloc.start()
    try:
        frame = compress(plain)
        compressing = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        back = decompress(frame, max_bytes=size)
        decompressing = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    assert back == plain
    assert compressing < size + size // 8, compressing / 2**20
    assert decompressing < size + size // 4, decompressing / 2**20
