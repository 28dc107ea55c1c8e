"""A commit as its encoded change, with the merger's error feedback: what the encoding loses in one round
goes into the next, so the committed parameters trail the true ones by one residual, never by a sum."""

import numpy as np

from slowlink.wire.commit_change import encode_change


def test_small_changes_below_the_encodings_resolution_arrive_instead_of_being_lost_every_round():
    # A block of 32 values: one moves by 1.0 a round and sets the block's scale; the others by 0.01, far
    # below the smallest F4 step at that scale, so alone they would round to zero every round.
    step = np.full(32, 0.01, np.float32)
    step[0] = 1.0
    true = committed = {"w": np.zeros(32, np.float32)}
    residual = None
    for _ in range(100):
        true = {"w": true["w"] + step}
        committed, _, residual = encode_change(true, committed, residual, "F4", {})
    lag = true["w"] - committed["w"]
    assert np.abs(lag).max() <= np.abs(residual["w"]).max() + 1e-5  # the lag is the residual itself
    assert np.abs(lag[1:]).max() < 0.5  # the 1.0 that 100 rounds of 0.01 add up to has mostly arrived
    # Without feedback, each round's 0.01 is rounded away: nothing of it is ever committed.
    alone = {"w": np.zeros(32, np.float32)}
    for _ in range(100):
        alone, _, _ = encode_change({"w": alone["w"] + step}, alone, None, "F4", {})
    assert np.all(alone["w"][1:] == 0.0)


def test_every_node_adding_the_decoded_change_gets_the_merger_s_parameters_bit_for_bit():
    from slowlink.wire import payload

    rng = np.random.default_rng(0)
    anchor = {"w": rng.normal(size=(8, 64)).astype(np.float32)}
    params = {"w": anchor["w"] + rng.normal(0, 0.01, size=(8, 64)).astype(np.float32)}
    committed, data, _ = encode_change(params, anchor, None, "F8_E4M3", {"kind": "x"})
    change, header = payload.unpack(data)
    assert header["kind"] == "change"
    assert np.array_equal(anchor["w"] + change["w"], committed["w"])
