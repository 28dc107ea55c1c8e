"""The MLX adapter against the torch adapter on the same values: one schema under torch's names, the same
roundings into bfloat16 and float16, the same digests of frozen weights, and the same payload bytes, so that
nothing a run stores depends on which framework a node trains in. Bad names are refused, naming the fix."""

import subprocess
import sys

import numpy as np
import pytest
import torch

mx = pytest.importorskip(
    "mlx.core", reason="needs MLX: pip install 'mlx[cpu]' on Linux (the mlx and dev extras)"
)
import mlx.nn as mnn  # noqa: E402

import slowlink as sl  # noqa: E402
from slowlink.frameworks.base import adapter_for  # noqa: E402
from slowlink.frameworks.mlx import MLXAdapter  # noqa: E402
from slowlink.frameworks.torch import TorchAdapter  # noqa: E402
from slowlink.wire import payload  # noqa: E402
from slowlink.wire.fragment import encode_fragment  # noqa: E402

from .two_frameworks import mlx_model, torch_model  # noqa: E402

NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]


class MLXTwoLayers(mnn.Module):  # a hand-written MLX module: its names are its attributes'
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.fc1, self.fc2 = mnn.Linear(4, hidden), mnn.Linear(hidden, 1)

    def __call__(self, x):
        return self.fc2(mx.tanh(self.fc1(x)))


def values(seed: int, shape: tuple[int, ...], ties: bool = False) -> np.ndarray:
    """Random float32 values; with ties, half of them exactly halfway between two bfloat16 values."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if ties:
        bits = x.reshape(-1).view(np.uint32)
        bits[::2] = (bits[::2] & 0xFFFF0000) | 0x8000
    return x


def torch_run(tmp_path, model) -> sl.DirMailbox:
    """A run created by a torch node that leaves at once: run.json holds its schema and model."""
    mailbox = sl.DirMailbox(tmp_path / "run")
    with sl.Session(model, algorithm=sl.DiLoCo(sync_every=4), mailbox=mailbox, node_id="torch"):
        pass
    return mailbox


def test_an_mlx_sequential_has_the_schema_of_the_same_torch_sequential_and_sessions_take_it():
    adapter = adapter_for(mlx_model(seed=0))
    assert isinstance(adapter, MLXAdapter)
    assert adapter.schema == TorchAdapter(torch_model(seed=0)).schema
    assert [name for name, _, _ in adapter.schema] == NAMES


def test_a_sequential_inside_a_module_loses_only_its_layers_step():
    class Block(mnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = mnn.Sequential(mnn.Linear(2, 3), mnn.ReLU(), mnn.Linear(3, 2))
            self.layers = [mnn.Linear(2, 2)]  # a plain list, as torch's ModuleList names it: kept

    names = [name for name, _, _ in MLXAdapter(Block()).schema]
    assert names == [
        "mlp.0.weight",
        "mlp.0.bias",
        "mlp.2.weight",
        "mlp.2.bias",
        "layers.0.weight",
        "layers.0.bias",
    ]


def test_a_model_named_otherwise_is_refused_naming_the_tensor_both_sides_and_the_mapping(tmp_path):
    mailbox = torch_run(tmp_path, torch_model(seed=1))
    with pytest.raises(sl.SchemaMismatch) as refused:
        sl.align(MLXTwoLayers(), mailbox=mailbox)
    message = str(refused.value)
    assert "'fc1.weight' (8, 4) float32" in message and "'0.weight' (8, 4) float32" in message
    assert "names={'<MLX name>': '<run name>'}" in message
    mapped = MLXAdapter(MLXTwoLayers(), names={"fc1.weight": "0.weight", "fc1.bias": "0.bias",
                                               "fc2.weight": "2.weight", "fc2.bias": "2.bias"})  # fmt: skip
    assert sl.align(mapped, mailbox=mailbox) == {0: 0}
    run = {name: p.detach().numpy() for name, p in torch_model(seed=1).named_parameters()}
    assert all(np.array_equal(run[name], mapped.snapshot([name])[name]) for name in NAMES)
    assert np.array_equal(np.array(mapped.model.fc2.weight), run["2.weight"])


def test_a_shape_or_dtype_that_cannot_match_is_refused_naming_the_tensor_and_both_sides(tmp_path):
    mailbox = torch_run(tmp_path, torch_model(seed=1))
    wider = MLXTwoLayers(hidden=16)
    with pytest.raises(
        sl.SchemaMismatch, match=r"tensor '0.weight' has shape \(16, 4\) here but \(8, 4\) in the run"
    ):
        sl.align(
            MLXAdapter(wider, names=lambda name: name.replace("fc1", "0").replace("fc2", "2")),
            mailbox=mailbox,
        )
    halved = mlx_model(seed=0)
    halved.apply(lambda a: a.astype(mx.bfloat16))
    with pytest.raises(
        sl.SchemaMismatch, match="'0.weight' is bfloat16 here but float32 in the run; cast the model"
    ):
        sl.align(halved, mailbox=mailbox)


@pytest.mark.parametrize(
    ("names", "fault"),
    [
        ({"fc3.weight": "0.weight"}, "names= maps \\['fc3.weight'\\], which this MLX model does not have"),
        ({"fc1.weight": "w", "fc2.weight": "w"}, "the same run name 'w'"),
        (lambda name: "", "a run name is a non-empty str"),
        (["fc1.weight"], "must be a dict"),
    ],
)
def test_a_bad_mapping_is_refused_naming_it(names, fault):
    with pytest.raises(sl.ConfigError, match=fault):
        MLXAdapter(MLXTwoLayers(), names=names)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_arrays_round_as_torch_tensors_do_in_and_out(dtype):
    """assign rounds to nearest even (ties included), snapshot widens exactly, shift rounds the change to the
    parameter's dtype and the sum back to it, and blend agrees to within torch's fused last bit."""
    shape = (64, 128)
    start, target, change = values(0, shape, ties=True), values(1, shape, ties=True), values(2, shape) * 1e-2
    theirs = torch.nn.Linear(128, 64, bias=False).to(getattr(torch, dtype))
    ours = mnn.Linear(128, 64, bias=False)
    ours.apply(lambda a: a.astype(getattr(mx, dtype)))
    t, m = TorchAdapter(theirs), MLXAdapter(ours)
    assert t.schema == m.schema == [("weight", shape, dtype)]
    t.assign({"weight": start})
    m.assign({"weight": start})
    assert np.array_equal(t.snapshot(["weight"])["weight"], m.snapshot(["weight"])["weight"])
    assert not np.array_equal(m.snapshot(["weight"])["weight"], start)  # it did round
    t.shift({"weight": change})
    m.shift([("weight", change)])
    assert np.array_equal(t.snapshot(["weight"])["weight"], m.snapshot(["weight"])["weight"])
    t.blend({"weight": target}, 0.25)
    m.blend({"weight": target}, 0.25)
    blended_t, blended_m = t.snapshot(["weight"])["weight"], m.snapshot(["weight"])["weight"]
    last_bit = 2**-7 if dtype == "bfloat16" else 2**-10  # of the value: at most one step of its dtype
    assert np.all(np.abs(blended_t - blended_m) <= last_bit * np.abs(blended_t) + 1e-7)
    assert ours.weight.dtype == getattr(mx, dtype)  # updates keep the model's dtype


def test_frozen_arrays_are_left_out_and_digested_as_torch_digests_the_same_bytes():
    theirs, ours = torch_model(seed=0).to(torch.bfloat16), mlx_model(seed=0)
    ours.apply(lambda a: a.astype(mx.bfloat16))
    same = {name: values(3 + i, shape) for i, (name, shape, _) in enumerate(TorchAdapter(theirs).schema)}
    TorchAdapter(theirs).assign(same)
    MLXAdapter(ours).assign(same)
    theirs[0].requires_grad_(False)
    ours.layers[0].freeze()
    t, m = TorchAdapter(theirs), MLXAdapter(ours)
    assert [name for name, _, _ in m.schema] == ["2.weight", "2.bias"] == [name for name, _, _ in t.schema]
    assert m.frozen() == t.frozen() and len(m.frozen()) == 2
    assert m.frozen()[0][:3] == ["0.weight", [8, 4], "bfloat16"]


def test_batchnorm_statistics_travel_as_torchs_buffers_do():
    theirs = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    ours = mnn.Sequential(mnn.Linear(4, 3), mnn.BatchNorm(3))
    t, m = TorchAdapter(theirs), MLXAdapter(ours)
    assert sorted(m.schema) == sorted(t.schema)  # torch's num_batches_tracked is local; MLX has none
    assert m.statistics == t.statistics == ["1.running_mean", "1.running_var"]
    assert m.frozen() == []


def test_params_chooses_by_run_name_as_for_torch(tmp_path):
    adapter = MLXAdapter(mlx_model(seed=0), params=lambda name: name.startswith("2."))
    assert [name for name, _, _ in adapter.schema] == ["2.weight", "2.bias"]
    assert sorted(adapter.local_state()) == ["0.bias", "0.weight"]  # trainable, not sent: the node's own
    with pytest.raises(
        sl.ConfigError, match="params= names \\['layers.0.weight'\\], which the model does not have"
    ):
        MLXAdapter(mlx_model(seed=0), params=["layers.0.weight"])


@pytest.mark.parametrize("encoding", ["F32", "BF16", "F8_E4M3", "F4"])
def test_both_frameworks_encode_a_contribution_into_the_same_bytes(encoding):
    """torch's node takes a device clone and encodes it where it lies (wire/on_device.py where it can); MLX's
    takes a host snapshot, encoded on the host: for the same parameters and anchor, the payloads are equal."""
    theirs, ours = torch_model(seed=0), mlx_model(seed=0)
    t, m = TorchAdapter(theirs), MLXAdapter(ours)
    trained = {name: values(4 + i, shape) for i, (name, shape, _) in enumerate(t.schema)}
    anchor = {name: values(9 + i, shape) for i, (name, shape, _) in enumerate(t.schema)}
    t.assign(trained)
    m.assign(trained)
    header = {"run": "r", "schema": "s", "kind": "delta", "fragment": 0, "round": 1, "node": "n"}
    packed = []
    for snapshot, anchors in ((t.clone(NAMES), t.on_device(anchor)), (m.snapshot(NAMES), anchor)):
        delta = {name: anchors[name] - snapshot[name] for name in NAMES}  # as the courier makes Δ
        encoded, _ = encode_fragment(delta, encoding)
        packed.append(payload.pack_encoded(encoded, header, encoding=encoding))
    assert packed[0] == packed[1]
    assert type(t.clone(NAMES)["0.weight"]) is torch.Tensor  # the torch side did take its device path


def test_importing_slowlink_never_imports_mlx():
    probe = "import sys, slowlink, slowlink.frameworks; assert 'mlx' not in sys.modules, sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_convolution_weights_travel_in_torchs_layout_and_compute_the_same_function():
    """MLX keeps a convolution's input channels last; the run holds torch's layout, so the same values give
    the same outputs (inputs laid out channels-last for MLX) and the same digests when frozen."""
    theirs = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3, padding=1, groups=1), torch.nn.Tanh(),
                                 torch.nn.Conv2d(5, 4, 3, padding=1), torch.nn.Tanh(),
                                 torch.nn.ConvTranspose2d(4, 2, 2, stride=2))  # fmt: skip
    ours = mnn.Sequential(mnn.Conv2d(3, 5, 3, padding=1), mnn.Tanh(), mnn.Conv2d(5, 4, 3, padding=1), mnn.Tanh(),
                          mnn.ConvTranspose2d(4, 2, 2, stride=2))  # fmt: skip
    t, m = TorchAdapter(theirs), MLXAdapter(ours)
    assert m.schema == t.schema  # (3, 3, 3) kernels of 3 channels: only the layout tells them apart
    names = [name for name, _, _ in t.schema]
    m.assign(t.snapshot(names))
    assert all(np.array_equal(m.snapshot([name])[name], t.snapshot([name])[name]) for name in names)
    x = values(5, (2, 3, 6, 6))
    np.testing.assert_allclose(np.moveaxis(np.array(ours(mx.array(np.moveaxis(x, 1, -1)))), -1, 1),
                               theirs(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-5)  # fmt: skip
    change = {name: values(6, shape) for name, shape, _ in t.schema}
    t.shift(change)
    m.shift(change)
    assert all(np.array_equal(m.snapshot([name])[name], t.snapshot([name])[name]) for name in names)
    theirs.requires_grad_(False)
    ours.freeze()
    with pytest.raises(sl.ConfigError, match="nothing to synchronize"):
        MLXAdapter(ours)
    frozen_t = TorchAdapter(theirs, params=["4.bias"]).frozen()
    assert MLXAdapter(ours, params=["4.bias"]).frozen() == frozen_t and len(frozen_t) == 5


def test_an_adapter_given_as_the_model_takes_its_choice_itself(tmp_path):
    mailbox = torch_run(tmp_path, torch_model(seed=1))
    with pytest.raises(
        sl.ConfigError, match=r"an adapter chooses its own schema: give it the choice, e.g. MLXAdapter"
    ):
        sl.align(MLXAdapter(mlx_model(seed=0)), mailbox=mailbox, params=["0.weight"])
    chosen = MLXAdapter(mlx_model(seed=0), params=["0.weight", "0.bias", "2.weight", "2.bias"])
    assert sl.align(chosen, mailbox=mailbox) == {0: 0}


def test_an_mlx_node_without_torch_checkpoints_its_optimizer_state_in_extra(tmp_path, monkeypatch):
    """sl.checkpoint takes a torch optimizer; an MLX one's state goes in `extra=` as numpy arrays, and a node
    on a machine without torch saves and loads it (docs/frameworks.md)."""
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten, tree_unflatten

    from .two_frameworks import batches

    monkeypatch.setitem(sys.modules, "torch", None)  # importing torch now fails, as on a Mac without it
    model, optimizer = mlx_model(seed=0), optim.Adam(learning_rate=1e-2)
    loss_and_grad = mnn.value_and_grad(model, lambda m, x, y: mnn.losses.mse_loss(m(x), y))
    algorithm, mailbox = sl.DiLoCo(sync_every=5), tmp_path / "run"
    with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="mac", poll_seconds=0.05) as session:
        for x, y in batches(0, 3):
            _, grads = loss_and_grad(model, mx.array(x), mx.array(y))
            optimizer.update(model, grads)
            mx.eval(model.parameters(), optimizer.state)
            session.step(samples=len(x))
        state = {key: np.array(value) for key, value in tree_flatten(optimizer.state)}
        sl.checkpoint.save(tmp_path / "mac.ckpt", session, extra={"optimizer": state, "epoch": 1})
        trained = session.adapter.snapshot(NAMES)
    again = optim.Adam(learning_rate=1e-2)
    with sl.Session(mlx_model(seed=3), algorithm=algorithm, mailbox=mailbox, node_id="mac") as session:
        steps, extra = sl.checkpoint.load(tmp_path / "mac.ckpt", session, extra=True)
        again.state = tree_unflatten([(key, mx.array(value)) for key, value in extra["optimizer"].items()])
        resumed = session.adapter.snapshot(NAMES)
    assert steps == 3 and extra["epoch"] == 1 and sorted(extra["optimizer"]) == sorted(state)
    assert all(np.array_equal(np.array(value), state[key]) for key, value in tree_flatten(again.state))
    assert all(
        np.allclose(resumed[name], trained[name], atol=1e-6) for name in NAMES
    )  # Θ − Δ_local: rounding
