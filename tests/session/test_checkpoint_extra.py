"""The rest of the training state in the same checkpoint file: sl.checkpoint.save(..., extra={...}) keeps a
scheduler's and a scaler's state_dicts, RNG states and the user's own counters, and load(..., extra=True)
gives them back as they were. Never pickle: what is not tensors, arrays and JSON values is refused."""

import functools
import math
import random

import numpy as np
import pytest
import torch
from safetensors import safe_open

import slowlink as sl

from .nodes import batches, sgd_step, tiny_mlp


def node(mailbox, model):
    return sl.Session(model, algorithm=sl.DiLoCo(sync_every=4, overlap_steps=0), mailbox=mailbox, node_id="n",
                      poll_seconds=0.005)  # fmt: skip


def scheduled(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    decay = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=20)
    return optimizer, torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, decay], milestones=[5])


def test_a_scheduler_rng_states_and_counters_come_back_from_the_same_file(tmp_path):
    mailbox, path, model = sl.MemoryMailbox(), tmp_path / "node.ckpt", tiny_mlp()
    optimizer, scheduler = scheduled(model)
    extra = {
        "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.default_rng(3).bit_generator.state,
        "legacy_numpy_rng": np.random.RandomState(4).get_state(),
        "python_rng": random.Random(5).getstate(),
        "big": [2**70, -(2**64)],
        "data": {"epoch": 2, "position": np.int64(1234), 7: "an int key", "best": math.inf, "nan": math.nan,
                 "shape": (3, 4), "seen": [1, 2, 3], "weights": np.arange(6, dtype=np.float64).reshape(2, 3)},
    }  # fmt: skip
    with node(mailbox, model) as session:
        for batch in batches(0, 6):
            optimizer.zero_grad()
            sgd_step(model, batch, 0.0)  # the gradients (at lr 0); the optimizer steps with them
            optimizer.step()
            scheduler.step()
            session.step(samples=4)
        extra["scheduler"] = scheduler.state_dict()
        sl.checkpoint.save(path, session, optimizer, extra=extra)
        lr = optimizer.param_groups[0]["lr"]
    with safe_open(path, framework="np") as opened:
        # The torch RNG state and the two numpy arrays sit beside the header, as safetensors entries.
        entries = sorted(key for key in opened.keys() if key.startswith("extra/"))  # noqa: SIM118
        assert entries == ["extra/0", "extra/1", "extra/2"]

    again = tiny_mlp()
    optimizer2, scheduler2 = scheduled(again)
    with node(mailbox, again) as session:
        steps, back = sl.checkpoint.load(path, session, optimizer2, extra=True)
        scheduler2.load_state_dict(back["scheduler"])
    assert steps == 6 and scheduler2.last_epoch == scheduler.last_epoch
    assert (
        optimizer2.param_groups[0]["lr"] == pytest.approx(lr)
        and scheduler2.get_last_lr() == scheduler.get_last_lr()
    )
    assert torch.equal(back["torch_rng"], extra["torch_rng"])
    assert back["numpy_rng"] == extra["numpy_rng"] and back["python_rng"] == extra["python_rng"]
    assert back["big"] == [2**70, -(2**64)]
    legacy = back["legacy_numpy_rng"]
    assert legacy[0] == "MT19937" and np.array_equal(legacy[1], extra["legacy_numpy_rng"][1])
    restored = np.random.RandomState()
    restored.set_state(legacy)
    assert restored.rand() == np.random.RandomState(4).rand()
    data = back["data"]
    assert (
        data["epoch"] == 2
        and data["position"] == 1234
        and data[7] == "an int key"
        and data["shape"] == (3, 4)
    )
    assert data["best"] == math.inf and math.isnan(data["nan"]) and data["seen"] == [1, 2, 3]
    assert isinstance(data["weights"], np.ndarray) and np.array_equal(
        data["weights"], extra["data"]["weights"]
    )


def test_a_checkpoint_without_extra_loads_as_before_and_gives_an_empty_extra(tmp_path):
    mailbox, path, model = sl.MemoryMailbox(), tmp_path / "node.ckpt", tiny_mlp()
    with node(mailbox, model) as session:
        session.step(samples=4)
        sl.checkpoint.save(path, session)
    with node(mailbox, tiny_mlp()) as session:
        assert sl.checkpoint.load(path, session) == 1
    with node(mailbox, tiny_mlp()) as session:
        assert sl.checkpoint.load(path, session, extra=True) == (1, {})


class Opaque:
    pass


@pytest.mark.parametrize(
    "extra, where",
    [({"scheduler": {"fn": print}}, r"extra\['scheduler'\]\['fn'\] is a builtin_function_or_method"),
     ({"data": [Opaque()]}, r"extra\['data'\]\[0\] is a Opaque"),
     ({"data": np.array([Opaque()])}, r"extra\['data'\] is a numpy array of Python objects"),
     ([1, 2], r"extra=list must be a dict"),
     ({"deep": functools.reduce(lambda inner, _: [inner], range(40), 0)}, r"nests deeper.*too deeply nested")],
)  # fmt: skip
def test_what_cannot_be_stored_without_pickle_is_refused_and_nothing_is_written(tmp_path, extra, where):
    path = tmp_path / "node.ckpt"
    with node(sl.MemoryMailbox(), tiny_mlp()) as session:
        session.step(samples=4)
        with pytest.raises(sl.ConfigError, match=where):
            sl.checkpoint.save(path, session, extra=extra)
    assert not path.exists()
