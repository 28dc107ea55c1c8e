"""Models as training code holds them: compiled and DDP-wrapped modules join a run of the plain model, a model
of another depth is told so, and the fragment plan can be printed before a run and is reported when it is
smaller than asked."""

import logging

import pytest
import torch

import slowlink as sl

from .nodes import batches, sgd_step, tiny_mlp

ALGORITHM = sl.DiLoCo(sync_every=2, outer_lr=1.0, outer_momentum=0.0, overlap_steps=0)


class Wrapper(torch.nn.Module):
    """What DistributedDataParallel and DataParallel look like from outside: the model as `module`."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


def compiled(model: torch.nn.Module) -> torch.nn.Module:
    # The eager backend traces like any other and needs no compiler: `_orig_mod.` names all the same.
    return torch.compile(model, backend="eager")


def train(model, session, node: int, steps: int) -> None:
    for batch in batches(node, steps):
        sgd_step(model, batch, 0.1)
        session.step(samples=4)


@pytest.mark.parametrize(
    "wrap", [compiled, Wrapper, lambda m: Wrapper(compiled(m))], ids=["compiled", "ddp", "both"]
)
def test_a_wrapped_model_joins_a_run_of_the_plain_model_and_aligns(wrap):
    mailbox = sl.MemoryMailbox()
    plain = tiny_mlp()
    with sl.Session(plain, algorithm=ALGORITHM, mailbox=mailbox, node_id="plain") as session:
        train(plain, session, 0, 2)
    wrapped = wrap(tiny_mlp(seed=3))
    assert any(name.startswith(("_orig_mod.", "module.")) for name, _ in wrapped.named_parameters())
    with sl.Session(wrapped, algorithm=ALGORITHM, mailbox=mailbox, node_id="wrapped") as session:
        assert [name for name, _, _ in session.adapter.schema] == ["0.weight", "0.bias", "2.weight", "2.bias"]
        train(wrapped, session, 1, 2)
    evaluator, committed = wrap(tiny_mlp(seed=9)), tiny_mlp(seed=8)
    assert sl.align(evaluator, mailbox=mailbox) == {0: 2}
    sl.align(committed, mailbox=mailbox)
    for (name, mine), (_, theirs) in zip(
        evaluator.named_parameters(), committed.named_parameters(), strict=True
    ):
        torch.testing.assert_close(mine, theirs, msg=name)
    assert not torch.equal(committed[0].weight, tiny_mlp(seed=9)[0].weight)


def test_a_deeper_model_is_told_the_tensor_counts_and_the_first_difference():
    mailbox = sl.MemoryMailbox()
    with sl.Session(tiny_mlp(), algorithm=ALGORITHM, mailbox=mailbox, node_id="first"):
        pass
    deeper = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)
    )
    with pytest.raises(
        sl.SchemaMismatch,
        match=r"the run's model has 4 tensors, this one 6; the first difference is tensor 3: '2.weight' "
        r"\(4, 4\) float32 here, '2.weight' \(1, 4\) float32 in the run",
    ):
        sl.Session(deeper, algorithm=ALGORITHM, mailbox=mailbox).__enter__()
    shallower = torch.nn.Sequential(torch.nn.Linear(3, 4))
    with pytest.raises(
        sl.SchemaMismatch,
        match=r"the run's model has 4 tensors, this one 2; the first difference is tensor 3: none here, "
        r"'2.weight' \(1, 4\) float32 in the run",
    ):
        sl.align(shallower, mailbox=mailbox)


class Blocks(torch.nn.Module):
    """An embedding, two blocks and a head: Strided plans the tensors outside blocks and one per block."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Linear(4, 4, bias=False)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))
        self.head = torch.nn.Linear(4, 1)


def test_plan_for_gives_the_fragments_a_run_of_this_model_would_have():
    # By bytes: the 3×4 weight alone, then the rest.
    assert sl.DiLoCo(sync_every=8, fragments=2).plan_for(tiny_mlp()) == [
        ["0.weight"],
        ["0.bias", "2.weight", "2.bias"],
    ]
    assert sl.DiLoCo(sync_every=8, fragments=3, partition=sl.Strided()).plan_for(Blocks()) == [
        ["emb.weight", "head.weight", "head.bias"], ["blocks.0.weight", "blocks.0.bias"],
        ["blocks.1.weight", "blocks.1.bias"],
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("algorithm", "model", "planned", "words"),
    [
        (sl.DiLoCo(sync_every=50, fragments=50), tiny_mlp, 4, "fragments=50, but the model has 4 tensors"),
        (sl.DiLoCo(sync_every=8, fragments=8, partition=sl.Strided()), Blocks, 3, "Strided found 2 blocks"),
    ],
)
def test_a_plan_smaller_than_asked_is_reported_at_warning_level_on_joining(
    algorithm, model, planned, words, caplog
):
    events = []
    caplog.set_level(logging.WARNING, logger="slowlink")
    with sl.Session(
        model(), algorithm=algorithm, mailbox=sl.MemoryMailbox(), on_event=events.append
    ) as session:
        assert len(session.plan) == planned == len(algorithm.plan_for(model()))
    reduced = [e for e in events if e.kind == "plan_reduced"]
    assert [e.data for e in reduced] == [{"asked": algorithm.fragments, "fragments": planned}]
    assert words in reduced[0].message
    assert any(
        record.levelno == logging.WARNING and "plan_reduced" in record.getMessage()
        for record in caplog.records
    )


def test_a_plan_as_large_as_asked_says_nothing():
    events = []
    with sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=4, fragments=2), mailbox=sl.MemoryMailbox(),
                    on_event=events.append):  # fmt: skip
        pass
    assert "plan_reduced" not in [e.kind for e in events]
