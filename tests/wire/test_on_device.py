"""Encodings on the model's device (wire/on_device.py) give the very bytes of the host codecs
(wire/encodings.py) for the same values: entries, refusals, decoded values and error-feedback residuals, over
random values of every magnitude and every edge (±0, float32 denormals, E4M3 subnormals, rounding ties,
values at each format's limit, NaN and infinities), and a fragment encoded there packs to the same payload.
On this machine the device is the CPU; the code path is the one a GPU takes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from slowlink.errors import PayloadError
from slowlink.wire import payload
from slowlink.wire.encodings import BF16_LIMIT, CHUNK_BLOCKS, ENCODINGS, SCALED_LIMIT
from slowlink.wire.error_feedback import error_feedback_encode
from slowlink.wire.fragment import HostBuffer, encode_fragment

torch = pytest.importorskip("torch")
on_device = pytest.importorskip("slowlink.wire.on_device")

NAMES = sorted(on_device.ENCODINGS)  # F32, BF16, F8_E4M3


def same_entries(device: dict, host: dict) -> bool:
    """Equal keys, and each entry of the same dtype and bytes (a device entry read as its host dtype)."""
    if device.keys() != host.keys():
        return False
    as_host = on_device.to_host({"t": ((), device)}, HostBuffer())["t"][1]
    return all(as_host[k].dtype == host[k].dtype and as_host[k].tobytes() == host[k].tobytes() for k in host)


def edge_values() -> np.ndarray:
    """Every edge the formats have, in blocks of 32 with their own maxima, so that each block's scale is
    known: ties at the top binade and in E4M3's subnormals, ties of BF16, zeros, float32 denormals."""
    rows = [
        # block max 448, scale 1: spacing 2 in [16, 32) (17 and 19 tie), 2**-10 and 3·2**-10 tie in the
        # subnormals, 1 + 1/16 and 1 + 3/16 tie, 464 would be the tie with E4M3's NaN code
        [
            448,
            17,
            19,
            -17,
            -19,
            2.0**-10,
            3 * 2.0**-10,
            -(2.0**-10),
            1.0625,
            1.1875,
            2.0**-9,
            2.0**-6,
            0.0,
            -0.0,
        ],
        # block max 1e-3: its scale is a power of two below 1
        [1e-3, 1e-3 * 1.0625, -5e-4, 3e-7, 1e-9, -0.0],
        # a block of float32 denormals: a scale of 2**-127 at the least
        [1e-45, -1e-45, 3e-39, -1.17e-38, 5e-40],
        # a huge block beside tiny values: those flush to zero of their sign at its scale
        [1.5e38, 1e-30, -1e-30, 2.0**100],
        # BF16 ties: halfway in the low 16 bits, to an even and to an odd kept bit
        [1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 2.0**-126 * (1 + 2.0**-8)],
        [0.0] * 32,  # a block of zeros
        [-0.0] * 32,
    ]
    blocks = np.zeros((len(rows), 32), np.float32)
    for row, values in zip(blocks, rows, strict=True):
        row[: len(values)] = values
    return blocks.reshape(-1)


def wide_range_values(seed: int, size: int = 20_000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(size) * np.exp2(rng.uniform(-60, 60, size))
    return values.astype(np.float32)


VALUE_SETS = {
    "edges": edge_values(),
    "normal": np.random.default_rng(0).standard_normal(4_099).astype(np.float32),  # not a multiple of 32
    "wide": wide_range_values(1),
    "tiny": (np.random.default_rng(2).standard_normal(1_000) * 1e-38).astype(np.float32),
    "scalar": np.array(0.3, np.float32),
    "empty": np.zeros((0, 3), np.float32),
    "matrix": np.random.default_rng(3).standard_normal((33, 7)).astype(np.float32),
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_device_entries_and_decoded_values_are_the_host_codecs_to_the_bit(name, values):
    if name == "BF16":
        values = values[np.abs(values) < BF16_LIMIT] if values.ndim == 1 else values
    tensor = torch.from_numpy(values.copy())
    device, host = on_device.ENCODINGS[name].encode(tensor), ENCODINGS[name].encode(values)
    assert same_entries(device, host)
    decoded = on_device.ENCODINGS[name].decode(device, values.shape)
    expected = ENCODINGS[name].decode(host, values.shape)
    assert tuple(decoded.shape) == expected.shape and decoded.numpy().tobytes() == expected.tobytes()


def test_the_edges_are_edges():
    """What the edge values must give, written out: both codecs agreeing cannot hide an error they share."""
    decoded = on_device.ENCODINGS["F8_E4M3"].decode(
        on_device.ENCODINGS["F8_E4M3"].encode(torch.from_numpy(edge_values())), (7 * 32,)
    )
    assert decoded[:14].tolist() == [
        448,
        16,
        20,
        -16,
        -20,
        0,
        2.0**-8,
        -0.0,
        1.0,
        1.25,
        2.0**-9,
        2.0**-6,
        0,
        0,
    ]
    assert np.signbit(decoded[7].item()) and np.signbit(
        decoded[6 * 32].item()
    )  # -2**-10 and -0 keep the sign
    assert decoded[3 * 32 + 1].item() == 0.0 and np.signbit(decoded[3 * 32 + 2].item())  # flushed, signed
    bf16 = on_device.ENCODINGS["BF16"].encode(torch.from_numpy(edge_values()))[""]
    assert bf16[4 * 32 : 4 * 32 + 3].tolist() == [0x3F80, 0x3F82, 0xBF80]  # ties to even
    assert bf16[2 * 32 + 2].item() == 0x0021  # a float32 denormal keeps its high half


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_infinities_are_refused_as_on_host(name, bad):
    values = np.ones(100, np.float32)
    values[57] = bad
    with pytest.raises(PayloadError, match="1 values are NaN or infinite"):
        on_device.ENCODINGS[name].encode(torch.from_numpy(values))


@pytest.mark.parametrize("name", NAMES)
def test_a_refusal_names_what_the_host_names_in_a_tensor_of_many_chunks(name):
    """The host codecs refuse chunk by chunk: the first chunk holding a bad value is the one described."""
    values = np.ones(3 * CHUNK_BLOCKS * 32 + 5, np.float32)
    values[CHUNK_BLOCKS * 32 + 7] = 3.4e38  # too large for BF16 and F8_E4M3, in the second chunk
    values[-1] = np.nan  # in the last chunk
    for why in ("cannot hold", "1 values are NaN") if name != "F32" else ("1 values are NaN",):
        with pytest.raises(PayloadError, match=why) as on_host:
            ENCODINGS[name].encode(values)
        with pytest.raises(PayloadError) as on_the_device:
            on_device.ENCODINGS[name].encode(torch.from_numpy(values))
        assert str(on_the_device.value) == str(on_host.value)
        values[CHUNK_BLOCKS * 32 + 7] = 1.0  # then the NaN of the last chunk is what is named


@pytest.mark.parametrize(("name", "limit"), [("BF16", BF16_LIMIT), ("F8_E4M3", SCALED_LIMIT)])
def test_magnitudes_a_format_cannot_hold_are_refused_and_those_just_below_pass(name, limit):
    with pytest.raises(PayloadError, match=f"which {name} cannot hold"):
        on_device.ENCODINGS[name].encode(torch.tensor([1.0, -limit]))
    below = np.array([1.0, np.nextafter(np.float32(limit), np.float32(0))], np.float32)
    assert same_entries(
        on_device.ENCODINGS[name].encode(torch.from_numpy(below)), ENCODINGS[name].encode(below)
    )


finite_floats = st.floats(-(2.0**120), 2.0**120, width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(values=arrays(np.float32, st.integers(0, 200), elements=finite_floats))
def test_any_finite_tensor_gets_the_host_entries(values):
    for name in NAMES:
        assert same_entries(
            on_device.ENCODINGS[name].encode(torch.from_numpy(values.copy())), ENCODINGS[name].encode(values)
        )


@pytest.mark.parametrize("name", ["BF16", "F8_E4M3"])
def test_error_feedback_on_the_device_keeps_the_host_residual_round_after_round(name):
    rng = np.random.default_rng(4)
    residual_host = residual_device = None
    for _ in range(4):
        delta = (rng.standard_normal(300) * 1e-3).astype(np.float32)
        host, residual_host = error_feedback_encode(delta, residual_host, name)
        device, residual_device = error_feedback_encode(
            torch.from_numpy(delta), residual_device, on_device.ENCODINGS[name]
        )
        assert same_entries(device, host)
        assert residual_device.numpy().tobytes() == residual_host.tobytes()


def fragment(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((64, 33)).astype(np.float32),
            "b": rng.standard_normal(5).astype(np.float32),
            "scale": np.array(-0.0, np.float32), "edges": edge_values()}  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("feedback", [False, True])
def test_a_fragment_encoded_on_the_device_packs_to_the_host_payload(name, feedback):
    header = {"kind": "delta", "run": "r", "fragment": 0}
    residual_host = residual_device = None
    for seed in range(3):  # with feedback, each round carries the previous one's residual
        arrays_ = fragment(seed)
        if name == "BF16":
            arrays_["edges"] = arrays_["edges"][np.abs(arrays_["edges"]) < BF16_LIMIT]
        tensors = {key: torch.from_numpy(values.copy()) for key, values in arrays_.items()}
        host, residual_host = encode_fragment(arrays_, name, feedback=feedback, residual=residual_host)
        device, residual_device = encode_fragment(tensors, name, feedback=feedback, residual=residual_device)
        on_host = payload.pack_encoded(host, header, encoding=name)
        assert payload.pack_encoded(device, header, encoding=name) == on_host
        assert payload.pack(arrays_, header, encoding=name) == on_host or feedback
        if feedback:
            assert isinstance(residual_device["w"], torch.Tensor)  # it stays beside Δ
            assert all(residual_device[k].numpy().tobytes() == residual_host[k].tobytes() for k in arrays_)


def test_a_residual_restored_on_host_joins_a_fragment_on_the_device():
    arrays_ = fragment(5)
    residual = {key: np.full(values.shape, 1e-4, np.float32) for key, values in arrays_.items()}
    tensors = {key: torch.from_numpy(values.copy()) for key, values in arrays_.items()}
    host, _ = encode_fragment(arrays_, "F8_E4M3", feedback=True, residual=residual)
    device, _ = encode_fragment(tensors, "F8_E4M3", feedback=True, residual=residual)
    header = {"kind": "delta"}
    assert payload.pack_encoded(device, header, encoding="F8_E4M3") == payload.pack_encoded(
        host, header, encoding="F8_E4M3"
    )


def test_encodings_without_a_device_form_take_the_host_path_with_the_same_bytes():
    arrays_ = fragment(6)
    arrays_["edges"] = arrays_["edges"][np.abs(arrays_["edges"]) < 6e4]  # F16's range
    tensors = {key: torch.from_numpy(values.copy()) for key, values in arrays_.items()}
    for name in ("F4", "F16", "F8_E4M3_TENSOR"):
        device, _ = encode_fragment(tensors, name)
        assert payload.pack_encoded(device, {}, encoding=name) == payload.pack(arrays_, {}, encoding=name)


def test_device_entries_are_copied_into_one_host_buffer_reused_from_fragment_to_fragment():
    """What a GPU's entries take (here forced from the CPU): one host buffer, grown once, then reused."""
    buffer, firsts = HostBuffer(), []
    for seed in range(3):
        arrays_ = fragment(seed)
        encoded = {key: (values.shape, on_device.ENCODINGS["F8_E4M3"].encode(torch.from_numpy(values)))
                   for key, values in arrays_.items()}  # fmt: skip
        copied = on_device.copy_to_host(encoded, buffer)
        host = {key: (values.shape, ENCODINGS["F8_E4M3"].encode(values)) for key, values in arrays_.items()}
        assert payload.pack_encoded(copied, {}, encoding="F8_E4M3") == payload.pack_encoded(
            host, {}, encoding="F8_E4M3"
        )
        assert all(
            np.shares_memory(entry, buffer.memory.numpy())
            for _, entries in copied.values()
            for entry in entries.values()
        )
        firsts.append(buffer.memory.data_ptr())
    assert firsts[0] == firsts[1] == firsts[2]  # the same memory every time


def test_a_refused_tensor_is_named():
    tensors = {"ok": torch.ones(3), "bad": torch.tensor([1.0, float("nan")])}
    with pytest.raises(PayloadError, match="tensor 'bad' cannot be encoded as F8_E4M3: 1 values are NaN"):
        encode_fragment(tensors, "F8_E4M3")
