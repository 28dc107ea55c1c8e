"""An FSDP island's rank 0 encodes a contribution tensor by tensor as it receives each (StreamedEncoding): the
same entries, residual and norm as the Courier's own encoding of the whole fragment, with error feedback too."""

import math

import numpy as np
import pytest
import torch

import slowlink as sl
from slowlink.algorithms.robust import l2_norm
from slowlink.collective.shards import StreamedEncoding


@pytest.mark.parametrize("delta_dtype", ["F32", "BF16", sl.TopK(fraction=1 / 8, chunk=16)])
def test_a_fragment_encoded_tensor_by_tensor_is_the_couriers_encoding(delta_dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.Linear(20, 6))
    method = sl.DiLoCo(sync_every=2, delta_dtype=delta_dtype, error_feedback=delta_dtype == "BF16")
    with sl.Session(model, algorithm=method, mailbox=sl.MemoryMailbox()) as session:
        courier, names = session.courier, session.plan[0]
        generator = np.random.default_rng(5)
        for _ in range(2):  # the second round adds the residual the first left
            delta = {
                name: generator.standard_normal(courier.latest[0][1][name].shape, np.float32)
                for name in names
            }
            streamed = StreamedEncoding(courier, 0, names)
            for name in names:
                streamed.take(name, delta[name].copy())
            encoded, residual = streamed.result()
            expected, expected_residual = courier._encode(0, delta)
            assert list(encoded) == list(expected) == names
            for name in names:
                assert encoded[name][0] == expected[name][0]
                for suffix, entry in expected[name][1].items():
                    assert np.array_equal(encoded[name][1][suffix], entry), (name, suffix)
            assert (residual is None) == (expected_residual is None) == (not courier.wire.error_feedback)
            for name in expected_residual or {}:
                assert np.array_equal(residual[name], expected_residual[name])
            assert math.isclose(streamed.norm(), l2_norm(delta), rel_tol=1e-12)
            if residual is not None:
                courier.residual[0] = residual  # as a merged contribution's residual becomes the next one's
