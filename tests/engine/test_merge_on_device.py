"""The merger's math runs where the model is, in its framework: the contributions it merges, the anchor, the
outer momentum and the outer step's results are torch tensors on the model's device (the CPU here, a GPU's
path where there is one), and the commits are bit for bit those of the same math on the host in numpy."""

import numpy as np
import pytest
import torch

import slowlink as sl
from slowlink.protocol import merger as merger_module
from tests.session.nodes import run_nodes, wide_mlp

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
NODES, STEPS, SYNC_EVERY = 2, 12, 4


def barrier_diloco() -> sl.DiLoCo:
    """Every round merges both nodes, whoever merges it and whenever it closes: the run is deterministic."""
    return sl.DiLoCo(sync_every=SYNC_EVERY, quorum_size=NODES, overlap_steps=0)


def train(monkeypatch, device: str, *, on_host: bool) -> tuple[list[torch.nn.Module], list[str]]:
    """Run the two nodes; with `on_host`, every merger is built without the adapter's `on_device` (the math
    in numpy). Returns the models and the kinds of arrays the method's merge and outer step were given."""
    seen: list[str] = []
    combine, outer_step = sl.DiLoCo.combine, sl.DiLoCo.outer_step

    def kinds(arrays: dict) -> None:
        seen.extend(
            f"torch:{v.device.type}" if isinstance(v, torch.Tensor) else type(v).__name__
            for v in arrays.values()
        )

    def spied_combine(self, contributions):
        def each():
            for delta, weight in contributions:
                kinds(delta)
                yield delta, weight

        merged = combine(self, each())
        kinds(merged)
        return merged

    def spied_outer_step(self, delta, state, anchor, **options):
        kinds(state)
        kinds(anchor)
        params, after = outer_step(self, delta, state, anchor, **options)
        kinds(params)
        kinds(after)
        return params, after

    monkeypatch.setattr(sl.DiLoCo, "combine", spied_combine)
    monkeypatch.setattr(sl.DiLoCo, "outer_step", spied_outer_step)
    if on_host:
        built = merger_module.Merger.__init__

        def on_host_init(self, *args, on_device=None, **kwargs):
            built(self, *args, **kwargs)

        monkeypatch.setattr(merger_module.Merger, "__init__", on_host_init)
    models, stats = run_nodes(NODES, barrier_diloco(), sl.MemoryMailbox(), STEPS, lr=0.05,
                              make_model=lambda: wide_mlp().to(device))  # fmt: skip
    assert [s.commits_applied for s in stats] == [STEPS // SYNC_EVERY] * NODES
    monkeypatch.undo()
    return models, seen


@pytest.mark.parametrize("device", DEVICES)
def test_the_merge_and_the_outer_step_run_on_the_models_device_with_the_bits_of_the_host_path(
    monkeypatch, device
):
    on_device, seen_on_device = train(monkeypatch, device, on_host=False)
    on_host, seen_on_host = train(monkeypatch, device, on_host=True)
    tensors = len(list(wide_mlp().parameters()))
    # per round: two contributions, the merged Δ, the momentum, the anchor, the parameters and momentum after
    assert len(seen_on_device) == (STEPS // SYNC_EVERY) * 7 * tensors
    assert set(seen_on_device) == {f"torch:{device}"}
    assert set(seen_on_host) == {"ndarray"}  # the spy tells the two paths apart
    for a, b in zip(on_device, on_host, strict=True):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert np.array_equal(
                p.detach().cpu().numpy().view(np.uint32), q.detach().cpu().numpy().view(np.uint32)
            )
    assert not torch.equal(next(on_device[0].parameters()).cpu(), next(wide_mlp().parameters()))  # it trained
