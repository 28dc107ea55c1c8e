"""sl.DeMo pinned to its definition (research/algorithms.md §6.1 and exactness test 5 of §8)."""

import numpy as np
import pytest
import torch

import slowlink as sl
from slowlink.algorithms import demo as d
from slowlink.engine.exchange import SingleNode
from tests.optim.threads import ThreadedGroup, run_threads


def gradients(seed: int, shape=(64, 32)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def momentum_of(optimizer: sl.DeMo, p: torch.Tensor, chunk: int) -> torch.Tensor:
    """p's momentum in p's own space: the inverse DCT of the coefficients its state holds."""
    layout = d.layout_of(tuple(p.shape), chunk)
    coefficients = optimizer.state[p]["momentum_coefficients"]
    return d.inverse(coefficients, layout, d.basis_of(layout, "dct", seed=0, step=0, like=coefficients))


def test_one_node_with_full_topk_is_sign_sgd_of_the_momentum():
    p = torch.nn.Parameter(torch.zeros(64, 32))
    optimizer = sl.DeMo([p], 0.01, topk=32 * 32, chunk=32, values="f32", compression_decay=0.9)
    momentum = torch.zeros(64, 32)
    for step in range(4):
        before = p.detach().clone()
        p.grad = gradients(step)
        optimizer.step()
        expected = -0.01 * torch.sign(0.9 * momentum + 0.01 * p.grad)  # m ← β·m + lr·g, p ← p − lr·sign(m)
        assert torch.allclose(p.detach() - before, expected, atol=1e-7)
        momentum = momentum_of(optimizer, p, 32)
        assert momentum.abs().max() < 1e-8  # everything was sent, and subtracted


def test_m_nodes_with_full_topk_step_by_the_sign_of_the_averaged_momentum():
    nodes, group = 3, ThreadedGroup(3)
    params = [torch.nn.Parameter(torch.zeros(64, 32)) for _ in range(nodes)]
    optimizers = [sl.DeMo([params[r]], 0.1, topk=1024, chunk=32, values="f32", exchange=group.member(r))
                  for r in range(nodes)]  # fmt: skip

    def node(rank):
        params[rank].grad = gradients(rank)
        optimizers[rank].step()

    run_threads([lambda r=r: node(r) for r in range(nodes)])
    averaged = sum(0.1 * gradients(r) for r in range(nodes)) / nodes
    for r in range(nodes):
        assert torch.equal(params[r].detach(), -0.1 * torch.sign(averaged))


def test_subtract_one_removes_exactly_what_was_sent_and_zero_keeps_it():
    kept = {}
    for subtract in (1.0, 0.0):
        p = torch.nn.Parameter(torch.zeros(64, 64))
        optimizer = sl.DeMo(
            [p], 1.0, topk=4, chunk=64, subtract=subtract, values="f32", compression_decay=0.5
        )
        p.grad = gradients(7, (64, 64))
        optimizer.step()
        kept[subtract] = momentum_of(optimizer, p, 64)
    sent = kept[0.0] - kept[1.0]  # the inverse transform of the 4 coefficients sent
    layout = d.layout_of((64, 64), 64)
    dct = d.forward(sent, layout, d.basis_of(layout, "dct", seed=0, step=0, like=sent))
    assert int((dct.abs() > 1e-5).sum()) == 4  # dense in space, 4 DCT coefficients
    assert int((sent.abs() > 1e-6).sum()) > 0.9 * 64 * 64
    assert torch.allclose(kept[0.0], gradients(7, (64, 64)), atol=1e-6)  # β·0 + lr·g, nothing removed


def test_the_identity_transform_steps_sparsely_and_the_dct_densely():
    changed = {}
    for transform in ("identity", "dct"):
        p = torch.nn.Parameter(torch.zeros(64, 64))
        optimizer = sl.DeMo([p], 0.01, topk=8, chunk=64, transform=transform)
        p.grad = gradients(3, (64, 64))
        optimizer.step()
        changed[transform] = int((p.detach() != 0).sum())
    assert changed["identity"] == 8  # the 8 largest gradients, in their own coordinates
    assert changed["dct"] > 0.9 * 64 * 64


def test_weight_decay_shrinks_as_the_reference_code_does():
    p = torch.nn.Parameter(torch.full((8, 8), 2.0))
    optimizer = sl.DeMo([p], 0.1, weight_decay=0.5, topk=64, chunk=8, values="f32")
    p.grad = torch.ones(8, 8)
    optimizer.step()
    assert torch.allclose(p.detach(), torch.full((8, 8), 2.0 * (1 - 0.1 * 0.5) - 0.1))


def test_bytes_are_counted_per_step():
    p = torch.nn.Parameter(torch.zeros(128, 64))  # two 64×64 chunks, 8 coefficients each
    optimizer = sl.DeMo([p], 0.01, topk=8, values="bf16", exchange=SingleNode())
    p.grad = gradients(1, (128, 64))
    optimizer.step()
    # the frame's 20-byte header and one size, then the tensor's: 2-byte header, indices in 12 bits each or
    # Rice-coded when shorter (8 of 4096 in each chunk: at least log2 C(4096, 8) bits), bf16 values
    assert 20 + 4 + 2 + 21 + 16 * 2 <= optimizer.stats["sent_bytes"] <= 20 + 4 + 2 + 16 * 12 // 8 + 16 * 2
    assert optimizer.stats["received_bytes"] == optimizer.stats["sent_bytes"]  # one node: its own


def test_a_peer_with_impossible_coefficients_is_left_out_and_counted():
    class HostilePeer:
        nodes = 2

        def all_gather(self, payload, *, step, max_bytes):
            assert len(payload) <= max_bytes
            return [payload, payload[:-4] + np.float32(np.nan).tobytes()]  # its last value a NaN

    p = torch.nn.Parameter(torch.zeros(64, 32))
    optimizer = sl.DeMo([p], 0.01, topk=1024, chunk=32, values="f32", exchange=HostilePeer())
    p.grad = gradients(0)
    optimizer.step()
    assert optimizer.refusals == [
        (1, "32×32 chunks of 0.0", "a NaN or infinite value among the coefficients")
    ]
    assert torch.allclose(p.detach(), -0.01 * torch.sign(gradients(0)))  # this node's own step, alone


@pytest.mark.parametrize(
    "options, words",
    [({"transform": "fft"}, "transform='fft'"), ({"topk": 0}, "topk=0"), ({"compression_decay": 1.0}, "β"),
     ({"values": "int4"}, "values='int4'"), ({"weight_decay": -1.0}, "weight_decay=-1.0")],
)  # fmt: skip
def test_bad_options_are_refused_naming_the_option(options, words):
    with pytest.raises(sl.ConfigError, match=words.replace("(", r"\(").replace("[", r"\[")):
        sl.DeMo([torch.nn.Parameter(torch.zeros(2))], 0.01, **options)


def test_parameters_that_are_not_floating_or_are_sparse_are_refused():
    with pytest.raises(sl.ConfigError, match="not floating point"):
        sl.DeMo([torch.zeros(3, dtype=torch.int64)], 0.01)
    with pytest.raises(sl.ConfigError, match="sparse"):
        sl.DeMo([torch.zeros(3, 3).to_sparse()], 0.01)


@pytest.mark.parametrize("transform", ["dct", "random"])
def test_steps_follow_the_definition_in_the_tensors_own_space(transform):
    # The optimizer keeps the momentum as coefficients (a random transform's moved to each step's basis);
    # the definition keeps it in p's space: m ← β·m + lr·g, send top-k of T_t(m), m ← m − T_t⁻¹(sent).
    p = torch.nn.Parameter(torch.zeros(16, 24))
    optimizer = sl.DeMo([p], 0.01, topk=5, chunk=8, values="f32", compression_decay=0.9, transform=transform)
    layout = d.layout_of((16, 24), 8)
    m, expected = torch.zeros(16, 24), torch.zeros(16, 24)
    for step in range(5):
        p.grad = gradients(10 + step, (16, 24))
        optimizer.step()
        m = 0.9 * m + 0.01 * p.grad
        basis = d.basis_of(layout, transform, seed=0, step=step, like=m)
        picked = d.top_k(d.forward(m, layout, basis), 5)
        sent = d.inverse(d.scatter(picked, layout.chunk_numel), layout, basis)
        m, expected = m - sent, expected - 0.01 * torch.sign(sent)
        assert torch.allclose(p.detach(), expected, atol=1e-7), f"step {step}"


def test_a_loaded_state_resumes_as_if_never_stopped():
    def run(steps, optimizer=None):
        p = (
            torch.nn.Parameter(torch.zeros(64, 48))
            if optimizer is None
            else optimizer.param_groups[0]["params"][0]
        )
        optimizer = optimizer or sl.DeMo([p], 0.01, topk=8, chunk=32, values="2bit")
        for step in steps:
            p.grad = gradients(step, (64, 48))
            optimizer.step()
        return p, optimizer

    p, whole = run(range(6))
    q, first = run(range(3))
    saved = {"params": q.detach().clone(), "state": first.state_dict()}
    r = torch.nn.Parameter(saved["params"])
    resumed = sl.DeMo([r], 0.01, topk=8, chunk=32, values="2bit")
    resumed.load_state_dict(saved["state"])
    run(range(3, 6), resumed)
    assert torch.equal(r.detach(), p.detach())
    assert torch.equal(resumed.state[r]["momentum_coefficients"], whole.state[p]["momentum_coefficients"])


def test_the_sign_step_follows_a_parameter_whose_memory_moved_and_one_that_is_not_contiguous():
    # The sign step keeps its views of the parameters from step to step: one whose .data is replaced (as a
    # checkpoint load may do) must step in its new memory, and a transposed one as a contiguous one would.
    moved = torch.nn.Parameter(torch.zeros(64, 32))
    strided = torch.nn.Parameter(torch.zeros(32, 64).t())  # (64, 32), not contiguous
    plain = torch.nn.Parameter(torch.zeros(64, 32))
    square, square_plain = torch.nn.Parameter(torch.zeros(32, 32)), torch.nn.Parameter(torch.zeros(32, 32))
    optimizer = sl.DeMo(
        [moved, strided, plain, square, square_plain], 0.01, topk=32 * 32, chunk=32, values="f32"
    )
    for step in range(4):
        for p in (moved, strided, plain):
            p.grad = gradients(step)
        square.grad = square_plain.grad = gradients(step, (32, 32))
        if step == 2:
            moved.data = moved.detach().clone()  # new memory, the same values
        if step == 3:  # the same memory, transposed: the values a contiguous copy would hold, other strides
            square.data = square.data.t()
            square_plain.data.copy_(square_plain.data.t().clone())  # in place: its memory stays
        optimizer.step()
        assert torch.equal(moved.detach(), plain.detach()), f"step {step}"
        assert torch.equal(strided.detach(), plain.detach()), f"step {step}"
        assert torch.equal(square.detach(), square_plain.detach()), f"step {step}"
    assert plain.detach().abs().sum() > 0
