"""What of a model travels: floating-point buffers with the parameters, integer buffers kept local, frozen
parameters checked at join and never sent, and `params=` choosing the rest (frameworks/torch.py)."""

import pytest
import torch

import slowlink as sl
from slowlink.frameworks import adapter_for

from .nodes import batches, run_nodes, sgd_step

H, STEPS = 4, 8
# outer lr 1 without momentum, both nodes in every round: each commit is the nodes' average.
AVERAGING = sl.DiLoCo(sync_every=H, outer_lr=1.0, outer_momentum=0.0, overlap_steps=0, quorum_size=2)


def normed_mlp(seed: int = 0) -> torch.nn.Module:
    """Batch norm first: its running statistics depend on the batches alone, not on the weights."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)
    )


def statistics(model) -> dict[str, torch.Tensor]:
    return {name: b.detach().clone() for name, b in model.named_buffers()}


def replayed_statistics(nodes: int, steps: int) -> dict[str, torch.Tensor]:
    """The running statistics a run of `nodes` averaging every H steps commits: each round, every node
    updates the committed statistics with its own batches, and the commit is their mean."""
    names = ("running_mean", "running_var")
    committed = {name: normed_mlp()[0].get_buffer(name) for name in names}
    for start in range(0, steps, H):
        finals = []
        for node in range(nodes):
            norm = torch.nn.BatchNorm1d(3)
            for name in names:
                norm.get_buffer(name).copy_(committed[name])
            for x, _ in batches(node, steps)[start : start + H]:
                norm(x)
            finals.append(statistics(norm))
        committed = {name: sum(f[name] for f in finals) / nodes for name in names}
    return committed


def test_two_nodes_end_with_the_average_of_their_running_statistics_and_count_their_own_batches():
    models, _ = run_nodes(2, AVERAGING, sl.MemoryMailbox(), STEPS, make_model=normed_mlp)
    expected = replayed_statistics(2, STEPS)
    for model in models:
        for name in ("running_mean", "running_var"):
            torch.testing.assert_close(model[0].get_buffer(name), expected[name], atol=1e-6, rtol=0)
        # An integer buffer stays each node's own: the batches this node's norm has seen.
        assert model[0].num_batches_tracked.item() == STEPS
    assert not torch.equal(expected["running_mean"], normed_mlp()[0].running_mean)


def test_align_loads_the_committed_running_statistics():
    mailbox = sl.MemoryMailbox()
    models, _ = run_nodes(2, AVERAGING, mailbox, STEPS, make_model=normed_mlp)
    evaluator = normed_mlp(seed=7)
    sl.align(evaluator, mailbox=mailbox)
    for name in ("running_mean", "running_var"):
        torch.testing.assert_close(evaluator[0].get_buffer(name), models[0][0].get_buffer(name))
    assert evaluator[0].num_batches_tracked.item() == 0  # local: align leaves it as it was
    evaluator.eval(), models[0].eval()
    x = batches(5, 1)[0][0]
    torch.testing.assert_close(evaluator(x), models[0](x))


@pytest.mark.parametrize("with_optimizer", [False, True], ids=["alone", "with-adam"])
def test_a_checkpoint_round_trips_the_running_statistics_and_the_batch_count(tmp_path, with_optimizer):
    mailbox, path = sl.MemoryMailbox(), tmp_path / "a.ckpt"
    algorithm = sl.DiLoCo(sync_every=H, outer_lr=1.0, outer_momentum=0.0, overlap_steps=0)
    model = normed_mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01) if with_optimizer else None
    with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="a", poll_seconds=0.005) as session:
        for batch in batches(0, 6):  # round 1 commits at step 4; steps 5 and 6 are local progress
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
        sl.checkpoint.save(path, session, optimizer)
        saved = statistics(model)
    restored = normed_mlp(seed=5)
    fresh = torch.optim.Adam(restored.parameters(), lr=0.01) if with_optimizer else None
    with sl.Session(
        restored, algorithm=algorithm, mailbox=mailbox, node_id="a", poll_seconds=0.005
    ) as session:
        assert sl.checkpoint.load(path, session, fresh) == 6
        after = statistics(restored)
    assert after.keys() == saved.keys()
    for name, values in saved.items():
        torch.testing.assert_close(after[name], values, atol=1e-6, rtol=0, msg=name)
    assert after["0.num_batches_tracked"].item() == 6


def test_a_checkpoint_of_a_model_that_keeps_other_tensors_is_refused(tmp_path):
    mailbox, path = sl.MemoryMailbox(), tmp_path / "a.ckpt"
    algorithm = sl.DiLoCo(sync_every=H, overlap_steps=0)
    with sl.Session(normed_mlp(), algorithm=algorithm, mailbox=mailbox, node_id="a") as session:
        sl.checkpoint.save(path, session)
    counting = normed_mlp()
    counting.register_buffer(
        "seen", torch.tensor(0)
    )  # an integer of its own: the same run, not the same node
    with sl.Session(counting, algorithm=algorithm, mailbox=mailbox, node_id="a") as session:
        with pytest.raises(
            sl.PayloadError, match=r"but this model keeps \['own/0.num_batches_tracked', 'own/seen'"
        ):
            sl.checkpoint.load(path, session)
    assert counting.seen.item() == 0


def test_params_turns_buffer_synchronization_off_by_name():
    def not_statistics(name):
        return "running" not in name

    models, _ = run_nodes(
        2, AVERAGING, sl.MemoryMailbox(), STEPS, make_model=normed_mlp, params=not_statistics
    )
    # Each node kept its own statistics; the weights were averaged all the same.
    assert not torch.equal(models[0][0].running_mean, models[1][0].running_mean)
    torch.testing.assert_close(models[0][1].weight, models[1][1].weight)
    adapter_names = sl.DiLoCo(sync_every=H).plan_for(normed_mlp(), params=not_statistics)
    assert sorted(name for group in adapter_names for name in group) == [
        "0.bias", "0.weight", "1.bias", "1.weight", "3.bias", "3.weight",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("params", "words"),
    [
        (["1.weight", "nope.weight"], r"params= names \['nope.weight'\], which the model does not have"),
        (["1.weight", "0.num_batches_tracked"], r"\['0.num_batches_tracked'\], which are not floating-point"),
        ("1.weight", "a list of tensor names or a predicate"),
        (lambda name: False, "params= selects none of the model's tensors"),
    ],
)
def test_a_params_selection_that_cannot_be_honoured_is_refused_before_joining(params, words):
    mailbox = sl.MemoryMailbox()
    with pytest.raises(sl.ConfigError, match=words):
        sl.Session(
            normed_mlp(), algorithm=sl.DiLoCo(sync_every=H), mailbox=mailbox, params=params
        ).__enter__()
    assert list(mailbox.list("")) == []


class Lora(torch.nn.Module):
    """A frozen base Linear and a small trainable low-rank adapter beside it."""

    def __init__(self, base_seed: int = 0, adapter_seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(base_seed)
        self.base = torch.nn.Linear(32, 32)
        self.base.requires_grad_(False)
        torch.manual_seed(adapter_seed)
        self.down = torch.nn.Linear(32, 2, bias=False)
        self.up = torch.nn.Linear(2, 32, bias=False)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x))


def lora_step(model, session, seed: int) -> None:
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(seed))
    loss = (model(x) ** 2).mean()
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p -= 0.1 * p.grad
    session.step(samples=4)


def test_frozen_parameters_are_never_sent_and_a_node_with_other_frozen_weights_is_refused():
    mailbox, events = sl.MemoryMailbox(), []
    algorithm = sl.DiLoCo(sync_every=2, overlap_steps=0)
    model = Lora()
    base = model.base.weight.detach().clone()
    with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="a", on_event=events.append) as a:
        assert [name for name, _, _ in a.adapter.schema] == ["down.weight", "up.weight"]
        for t in range(4):
            lora_step(model, a, t)
    sent = [e.data["bytes"] for e in events if e.kind == "contribution_sent"]
    trainable, frozen = 2 * 2 * 32 * 4, (32 * 32 + 32) * 4
    assert len(sent) == 2 and all(size < trainable + 1024 < frozen for size in sent)
    assert torch.equal(model.base.weight, base)

    # Another adapter start joins (it takes the run's adapter); another base is refused, naming the tensor.
    with sl.Session(Lora(adapter_seed=3), algorithm=algorithm, mailbox=mailbox, node_id="b"):
        pass
    other_base = Lora(base_seed=1)
    before = list(mailbox.list(""))
    with pytest.raises(sl.SchemaMismatch, match=r"frozen tensor 'base.weight' differs from the run's"):
        sl.Session(other_base, algorithm=algorithm, mailbox=mailbox, node_id="c").__enter__()
    assert [item.key for item in mailbox.list("")] == [item.key for item in before]
    with pytest.raises(sl.SchemaMismatch, match=r"frozen tensor 'base.weight' differs from the run's"):
        sl.align(other_base, mailbox=mailbox)
    committed = Lora(adapter_seed=9)
    sl.align(committed, mailbox=mailbox)
    torch.testing.assert_close(committed.up.weight, model.up.weight)


def test_params_names_exactly_what_travels_and_sorts_the_rest_into_frozen_and_local():
    adapter = adapter_for(Lora(), ["base.weight", "up.weight"])
    assert [name for name, _, _ in adapter.schema] == ["base.weight", "up.weight"]  # a frozen one, if named
    assert [entry[0] for entry in adapter.frozen()] == ["base.bias"]  # checked at join
    assert list(adapter.local) == ["down.weight"]  # trainable, but this node's own: checkpointed, never sent
    own = adapter.local_state()
    adapter.model.down.weight.data.zero_()
    adapter.load_local_state(own)
    torch.testing.assert_close(adapter.model.down.weight, Lora().down.weight)
