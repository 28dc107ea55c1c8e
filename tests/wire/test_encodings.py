"""Wire encodings: error bounds on random data and a real model delta, bit-exact rounding against
ml_dtypes, exact round trips on the grid, byte layouts, edge values, and error feedback."""

import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from slowlink.errors import PayloadError
from slowlink.wire.encodings import BF16_LIMIT, ENCODINGS, F16_LIMIT, SCALED_LIMIT, get_encoding
from slowlink.wire.error_feedback import error_feedback_encode

LOSSY = ["F16", "BF16", "F8_E4M3", "F8_E4M3_TENSOR", "F4"]


def round_trip(name: str, values: np.ndarray) -> np.ndarray:
    codec = ENCODINGS[name]
    return codec.decode(codec.encode(values), values.shape)


def relative_error(decoded: np.ndarray, values: np.ndarray) -> float:
    return float(np.linalg.norm(decoded - values) / np.linalg.norm(values))


@functools.cache
def model_delta(seed: int = 0, steps: int = 10) -> dict[str, np.ndarray]:
    """anchor − local of a small transformer after a few Adam steps: a real pseudo-gradient."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only contend
    try:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(
            torch.nn.Embedding(64, 32),
            torch.nn.TransformerEncoderLayer(32, 4, 128, dropout=0.0, batch_first=True),
            torch.nn.Linear(32, 64),
        )
        anchor = {name: p.detach().clone() for name, p in model.named_parameters()}
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(steps):
            tokens = torch.randint(0, 64, (8, 16))
            logits = model(tokens).reshape(-1, 64)
            loss = torch.nn.functional.cross_entropy(logits, tokens.roll(1, 1).reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return {name: (anchor[name] - p.detach()).numpy() for name, p in model.named_parameters()}


def reference_block_codes(values: np.ndarray, scales: np.ndarray, dtype: type) -> np.ndarray:
    """ml_dtypes' round-to-nearest-even of each 32-value block divided by its scale."""
    padded = np.zeros(len(scales) * 32, np.float64)
    padded[: values.size] = values.reshape(-1)
    return (padded.reshape(-1, 32) / scales[:, None]).astype(dtype)


def e8m0(scale_bytes: np.ndarray) -> np.ndarray:
    return np.ldexp(1.0, scale_bytes.astype(np.int64) - 127)


# ---- error bounds ----------------------------------------------------------------------------------

# (name, least and most relative L2 error): measured 2.07e-4, 1.66e-3, 2.65e-2, 2.65e-2, 0.1158 on
# 100k normal values; the lower bound catches an encoding that silently sends float32.
NORMAL_BOUNDS = [
    ("F16", 1.5e-4, 2.5e-4),
    ("BF16", 1.2e-3, 2.0e-3),
    ("F8_E4M3", 2.0e-2, 3.0e-2),
    ("F8_E4M3_TENSOR", 2.0e-2, 3.0e-2),
    ("F4", 0.10, 0.125),
]


@pytest.mark.parametrize(("name", "least", "most"), NORMAL_BOUNDS)
def test_each_encoding_loses_what_its_precision_predicts_on_normal_data(name, least, most):
    values = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
    assert least < relative_error(round_trip(name, values), values) < most


def test_f32_is_exact():
    values = np.random.default_rng(1).standard_normal((37, 11)).astype(np.float32)
    assert np.array_equal(round_trip("F32", values), values)


# Measured on the delta of model_delta(): overall 2.03e-4, 1.65e-3, 2.59e-2, 0.104; worst tensor
# 2.52e-4, 1.90e-3, 3.24e-2, 0.120.
DELTA_BOUNDS = [
    ("F16", 2.5e-4, 3.0e-4),
    ("BF16", 2.0e-3, 2.3e-3),
    ("F8_E4M3", 3.0e-2, 3.6e-2),
    ("F4", 0.115, 0.13),
]


@pytest.mark.parametrize(("name", "overall", "worst"), DELTA_BOUNDS)
def test_a_real_model_delta_round_trips_within_the_bound_of_each_encoding(name, overall, worst):
    delta = model_delta()
    decoded = {key: round_trip(name, values) for key, values in delta.items()}
    flat = np.concatenate([values.ravel() for values in delta.values()])
    flat_decoded = np.concatenate([decoded[key].ravel() for key in delta])
    assert relative_error(flat_decoded, flat) < overall
    assert max(relative_error(decoded[key], delta[key]) for key in delta) < worst
    assert all(decoded[key].shape == delta[key].shape for key in delta)


def test_per_block_scales_keep_small_blocks_that_a_tensor_scale_flushes():
    # Blocks whose magnitudes differ by 2**20: one scale for all leaves the small ones below E4M3's
    # smallest subnormal, a scale per block keeps 3 mantissa bits everywhere.
    rng = np.random.default_rng(2)
    values = rng.standard_normal((64, 32)).astype(np.float32)
    values[1::2] *= np.float32(2.0**-20)
    small = values[1::2]
    assert relative_error(round_trip("F8_E4M3", values)[1::2], small) < 0.03
    assert relative_error(round_trip("F8_E4M3_TENSOR", values)[1::2], small) == 1.0


# ---- rounding: bit-exact against ml_dtypes, ties to even, exact on the grid -------------------------


def wide_range_values(seed: int, size: int = 50_000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(size) * np.exp2(rng.uniform(-40, 40, size))
    values[:64] = 0.0
    values[64:96] = -0.0
    values[96:128] = rng.standard_normal(32) * 1e-40  # float32 denormals
    return values.astype(np.float32)


def test_bf16_and_f16_bits_equal_ml_dtypes_and_numpy_casts():
    values = wide_range_values(3)
    values = values[np.abs(values) < 60_000]  # F16's range, so both casts apply
    bf16 = ENCODINGS["BF16"].encode(values)[""]
    assert np.array_equal(bf16, values.astype(ml_dtypes.bfloat16).view(np.uint16))
    f16 = ENCODINGS["F16"].encode(values)[""]
    assert np.array_equal(f16.view(np.uint16), values.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize(
    ("name", "dtype"), [("F8_E4M3", ml_dtypes.float8_e4m3fn), ("F4", ml_dtypes.float4_e2m1fn)]
)
def test_block_codes_equal_ml_dtypes_rounding_of_each_block_over_its_scale(name, dtype):
    values = wide_range_values(4)
    entries = ENCODINGS[name].encode(values)
    if name == "F8_E4M3":
        scales, expected_codes = entries["@scale"].astype(np.float64), None
        expected_codes = reference_block_codes(values, scales, dtype).view(np.uint8).reshape(-1)
        assert np.array_equal(entries[""], expected_codes)
    else:
        scales = e8m0(entries["@scale"])
        expected = reference_block_codes(values, scales, dtype).astype(np.float32) * scales[:, None]
        decoded = ENCODINGS[name].decode(entries, values.shape)
        assert np.array_equal(decoded, expected.reshape(-1)[: values.size].astype(np.float32))


def test_ties_round_to_even_in_every_format():
    # F4, block max 6 so the scale is 1: ties .25 .75 1.25 1.75 2.5 3.5 5 go to the even code.
    f4_in = np.array([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -5, -0.75], np.float32)
    assert round_trip("F4", f4_in).tolist() == [6, 0, 1, 1, 2, 2, 4, 4, -4, -1]
    # F8, block max 448 so the scale is 1; spacing 2 in [16, 32): 17 -> 16, 19 -> 20; 2**-10 -> 0.
    f8_in = np.array([448, 17, 19, -17, 2.0**-10, 3 * 2.0**-10], np.float32)
    assert round_trip("F8_E4M3", f8_in).tolist() == [448, 16, 20, -16, 0, 2.0**-8]
    # BF16 keeps 8 significant bits: 1 + 2**-8 -> 1, 1 + 3 * 2**-8 -> 1 + 2**-6.
    bf16_in = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8], np.float32)
    assert round_trip("BF16", bf16_in).tolist() == [1.0, 1 + 2.0**-6]


@pytest.mark.parametrize("name", ["F8_E4M3", "F4"])
def test_values_already_on_the_grid_round_trip_exactly(name):
    rng = np.random.default_rng(5)
    codec, blocks = ENCODINGS[name], 300
    if name == "F8_E4M3":
        codes = rng.integers(0, 256, blocks * 32, dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0  # NaN codes
        entries = {"": codes, "@scale": np.ldexp(np.float32(1), rng.integers(-100, 100, blocks))}
    else:
        entries = {
            "": rng.integers(0, 256, blocks * 16, dtype=np.uint8),
            "@scale": rng.integers(27, 227, blocks, dtype=np.uint8),
        }
    on_grid = codec.decode(entries, (blocks * 32,))
    assert np.array_equal(round_trip(name, on_grid), on_grid)
    assert np.count_nonzero(on_grid) > blocks * 25


def test_bf16_and_f16_values_round_trip_exactly():
    rng = np.random.default_rng(6)
    bf16 = rng.integers(0, 1 << 16, 10_000, dtype=np.uint32) << 16
    bf16_values = bf16.view(np.float32)[np.isfinite(bf16.view(np.float32))]
    assert np.array_equal(round_trip("BF16", bf16_values), bf16_values)
    f16_values = rng.integers(0, 1 << 16, 10_000, dtype=np.uint16).view(np.float16)
    f16_values = f16_values[np.isfinite(f16_values)].astype(np.float32)
    assert np.array_equal(round_trip("F16", f16_values), f16_values)


def test_scales_are_powers_of_two_that_bring_each_block_maximum_up_to_the_format_maximum():
    values = wide_range_values(7)
    blocks = np.abs(np.concatenate([values, np.zeros(-values.size % 32, np.float32)]).reshape(-1, 32))
    absmax = blocks.max(axis=1).astype(np.float64)
    live = absmax > 2.0**-100  # below, the scale is clamped at 2**-127 (E8M0's least)
    f8_scales = ENCODINGS["F8_E4M3"].encode(values)["@scale"].astype(np.float64)
    assert np.all(np.frexp(f8_scales)[0] == 0.5)
    assert np.all((absmax / f8_scales)[live] > 224) and np.all(absmax / f8_scales <= 448)
    f4_scales = e8m0(ENCODINGS["F4"].encode(values)["@scale"])
    assert np.all((absmax / f4_scales)[live] > 3) and np.all(absmax / f4_scales <= 6)


# ---- byte layouts ----------------------------------------------------------------------------------


def test_f4_packs_two_codes_per_byte_low_nibble_first_with_one_e8m0_byte_per_block():
    values = np.array([1.0, -0.5, 6.0, 0.0, 3.0], np.float32)  # codes 2, 8|1, 7, 0, 5; scale 2**0
    entries = ENCODINGS["F4"].encode(values)
    assert entries[""].dtype == np.uint8 and entries[""].size == 16
    assert entries[""][:3].tolist() == [0x92, 0x07, 0x05]
    assert entries["@scale"].tolist() == [127]
    doubled = ENCODINGS["F4"].encode(values * 4)["@scale"]
    assert doubled.tolist() == [129]


def test_f8_stores_e4m3fn_codes_and_a_float32_scale_per_block():
    values = np.array([448.0, -1.0, 2.0**-9, -(2.0**-6)], np.float32)  # scale 1
    entries = ENCODINGS["F8_E4M3"].encode(values)
    assert entries[""][:4].tolist() == [0x7E, 0xB8, 0x01, 0x88]
    assert entries["@scale"].dtype == np.float32 and entries["@scale"].tolist() == [1.0]
    assert entries[""].size == 32  # zero-padded to a whole block


def test_bf16_stores_the_rounded_top_half_of_each_float32():
    entries = ENCODINGS["BF16"].encode(np.array([1.0, -2.0, 3.0], np.float32))
    assert entries[""].dtype == np.uint16 and entries[""].tolist() == [0x3F80, 0xC000, 0x4040]


# ---- shapes, sources and edge values --------------------------------------------------------------


# The largest error of one value, as a fraction of the tensor's largest magnitude: half a step.
WORST_STEP = {"F32": 0.0, "F16": 2.0**-11, "BF16": 2.0**-8, "F8_E4M3": 2.0**-4, "F8_E4M3_TENSOR": 2.0**-4}
WORST_STEP["F4"] = 1 / 3  # the block's scale s, with its largest magnitude in (3s, 6s]


@pytest.mark.parametrize("name", ["F32", *LOSSY])
@pytest.mark.parametrize("shape", [(0,), (1,), (31,), (32,), (33,), (1000,), (3, 7), (2, 0, 5), ()])
def test_empty_odd_sized_and_multidimensional_tensors_keep_their_shape(name, shape):
    values = (np.random.default_rng(8).standard_normal(shape) * 3).astype(np.float32)
    decoded = round_trip(name, values)
    assert decoded.shape == shape and decoded.dtype == np.float32
    largest = np.abs(values).max(initial=0.0)
    assert np.all(np.abs(decoded - values) <= WORST_STEP[name] * largest)


@pytest.mark.parametrize("name", ["F32", *LOSSY])
def test_zeros_of_either_sign_decode_to_zeros(name):
    values = np.array([0.0, -0.0] * 40, np.float32)
    decoded = round_trip(name, values)
    assert np.array_equal(decoded, values) and np.array_equal(np.signbit(decoded), np.signbit(values))


def test_float32_denormals_pass_f32_and_bf16_and_keep_what_each_scaled_format_can_hold():
    denormals = np.array([1e-40, -3e-42, 2.0**-149, 7e-39] * 8, np.float32)
    assert np.array_equal(round_trip("F32", denormals), denormals)
    assert np.array_equal(
        round_trip("BF16", denormals), denormals.astype(ml_dtypes.bfloat16).astype(np.float32)
    )
    assert np.array_equal(round_trip("F16", denormals), np.zeros_like(denormals))
    # A block of denormals gets the least scale, 2**-127: E4M3 then resolves 2**-136, F4 2**-128.
    f8 = round_trip("F8_E4M3", denormals)
    assert np.all(np.abs(f8 - denormals) <= np.maximum(np.abs(denormals) / 16, 2.0**-137))
    f4 = round_trip("F4", denormals)
    assert np.all(np.abs(f4 - denormals) <= np.maximum(np.abs(denormals) / 4, 2.0**-128))


def test_half_precision_sources_are_accepted_and_their_own_format_is_exact():
    rng = np.random.default_rng(9)
    as_f16 = rng.standard_normal(999).astype(np.float16)
    as_bf16 = rng.standard_normal(999).astype(ml_dtypes.bfloat16)
    assert np.array_equal(round_trip("F16", as_f16), as_f16.astype(np.float32))
    assert np.array_equal(round_trip("BF16", as_bf16), as_bf16.astype(np.float32))
    assert relative_error(round_trip("F8_E4M3", as_f16), as_f16.astype(np.float32)) < 0.03
    assert relative_error(round_trip("F4", as_bf16), as_bf16.astype(np.float32)) < 0.125


@pytest.mark.parametrize("name", ["F32", *LOSSY])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_infinities_are_refused_with_a_payload_error(name, bad):
    values = np.ones(100, np.float32)
    values[57] = bad
    with pytest.raises(PayloadError, match="1 values are NaN or infinite"):
        ENCODINGS[name].encode(values)


@pytest.mark.parametrize(
    ("name", "limit", "below"),
    [
        ("F16", F16_LIMIT, 65504.0),
        ("BF16", BF16_LIMIT, float(np.nextafter(np.float32(BF16_LIMIT), np.float32(0)))),
        ("F8_E4M3", SCALED_LIMIT, 1.5e38),
        ("F4", SCALED_LIMIT, 1.5e38),
    ],
)
def test_magnitudes_a_format_cannot_hold_are_refused_and_those_just_below_pass(name, limit, below):
    with pytest.raises(PayloadError, match=f"which {name} cannot hold"):
        ENCODINGS[name].encode(np.array([1.0, -limit], np.float32))
    decoded = round_trip(name, np.array([1.0, below], np.float32))
    assert np.all(np.isfinite(decoded)) and decoded[1] > 0.7 * below


def test_decoders_refuse_entries_of_the_wrong_dtype_or_size_and_nan_codes():
    f8 = ENCODINGS["F8_E4M3"]
    entries = f8.encode(np.ones(40, np.float32))
    with pytest.raises(ValueError, match="expected uint8\\[64\\]"):
        f8.decode({"": entries[""][:32], "@scale": entries["@scale"]}, (40,))
    with pytest.raises(ValueError, match="expected float32\\[2\\]"):
        f8.decode({"": entries[""], "@scale": entries["@scale"].astype(np.float64)}, (40,))
    with pytest.raises(ValueError, match="NaN codes"):
        f8.decode({"": np.full(64, 0xFF, np.uint8), "@scale": entries["@scale"]}, (40,))
    f4 = ENCODINGS["F4"]
    nan_scale = {"": np.full(16, 0x22, np.uint8), "@scale": np.array([255], np.uint8)}
    assert np.all(np.isnan(f4.decode(nan_scale, (32,))))  # payload.unpack then rejects it
    with pytest.raises(PayloadError, match="unknown encoding 'F3'"):
        get_encoding("F3")


# ---- properties ------------------------------------------------------------------------------------

finite_floats = st.floats(-(2.0**120), 2.0**120, width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(values=arrays(np.float32, st.integers(0, 200), elements=finite_floats))
def test_any_finite_tensor_round_trips_like_ml_dtypes_and_its_decoded_values_are_fixed_points(values):
    for name, dtype in [("F8_E4M3", ml_dtypes.float8_e4m3fn), ("F4", ml_dtypes.float4_e2m1fn)]:
        codec = ENCODINGS[name]
        entries = codec.encode(values)
        decoded = codec.decode(entries, values.shape)
        scales = entries["@scale"].astype(np.float64) if name == "F8_E4M3" else e8m0(entries["@scale"])
        expected = reference_block_codes(values, scales, dtype).astype(np.float64) * scales[:, None]
        assert np.array_equal(decoded, expected.reshape(-1)[: values.size].astype(np.float32))
        # A rounded block may take a smaller scale when encoded again, but its values stay.
        assert np.array_equal(codec.decode(codec.encode(decoded), values.shape), decoded)
    bf16 = round_trip("BF16", values)
    assert np.array_equal(bf16, values.astype(ml_dtypes.bfloat16).astype(np.float32))


# ---- error feedback --------------------------------------------------------------------------------


def test_error_feedback_makes_the_sum_of_f4_deltas_track_the_true_sum():
    # 200 rounds of noisy deltas with a small persistent drift. Measured relative error of the summed
    # deltas: 0.115 without feedback (each round's error adds up), 0.0081 with it (only the last
    # residual is missing), 14 times smaller.
    rng = np.random.default_rng(10)
    drift = 0.02 * rng.standard_normal(4096).astype(np.float32)
    true, plain, fed, residual = np.zeros(4096), np.zeros(4096), np.zeros(4096), None
    f4 = ENCODINGS["F4"]
    for _ in range(200):
        delta = (drift + rng.standard_normal(4096)).astype(np.float32)
        true += delta
        plain += f4.decode(f4.encode(delta), delta.shape)
        entries, residual = error_feedback_encode(delta, residual, "F4")
        fed += f4.decode(entries, delta.shape)
    assert relative_error(plain, true) > 0.10
    assert relative_error(fed, true) < 0.01
    assert np.allclose(true - fed, residual, atol=1e-3)  # what is missing is exactly the residual


def test_error_feedback_delivers_small_persistent_deltas_that_f4_alone_flushes_to_zero():
    # Each block holds one ±1 and 31 values of 0.01: below a quarter of F4's smallest step at that
    # scale, so plain F4 sends zeros every round; with feedback they arrive in bursts.
    rng = np.random.default_rng(11)
    spikes = np.zeros(4096, np.float32)
    spikes[::32] = 1.0
    drift = np.where(spikes > 0, 0.0, 0.01).astype(np.float32)
    plain, fed, residual = np.zeros(4096), np.zeros(4096), None
    for _ in range(200):
        delta = spikes * rng.choice([-1.0, 1.0], 4096).astype(np.float32) + drift
        plain += round_trip("F4", delta)
        entries, residual = error_feedback_encode(delta, residual, ENCODINGS["F4"])
        fed += ENCODINGS["F4"].decode(entries, delta.shape)
    small = drift > 0
    assert np.all(plain[small] == 0.0)
    assert np.allclose(fed[small], 2.0, atol=0.5)  # true sum 200 * 0.01 = 2.0


def test_error_feedback_starts_from_no_residual_and_checks_its_shape():
    values = np.array([0.3, -1.7, 2.2], np.float32)
    entries, residual = error_feedback_encode(values, None, "F32")
    assert np.array_equal(entries[""], values) and np.array_equal(residual, np.zeros(3))
    with pytest.raises(ValueError, match="residual has shape"):
        error_feedback_encode(values, np.zeros(4, np.float32), "F4")
