"""A sync step asks of the training thread only a device copy of the fragment: no `.numpy()`, no `.cpu()` and
no move of a parameter to host happens on it; the communication thread makes the host copy. On this machine
the device is the CPU, and the code path is the one a GPU takes (a torch function mode sees every call)."""

import threading

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import slowlink as sl
from slowlink.wire import payload

from .nodes import batches, sgd_step, wide_mlp

HOST_CALLS = {"numpy", "cpu"}
# Where the model may live: the CPU here, and a GPU's path where there is one.
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


class HostCopies(TorchFunctionMode):
    """Records, on the thread that entered it, every call that brings a tensor to host memory."""

    def __init__(self, parameters: list[torch.Tensor]) -> None:
        super().__init__()
        self.parameters = {id(p) for p in parameters}
        self.calls: list[str] = []
        self.thread = threading.get_ident()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        moves_a_parameter = (
            name == "to"
            and args
            and id(args[0]) in self.parameters
            and (any(isinstance(a, str | torch.device) for a in args[1:]) or "device" in kwargs)
        )
        if threading.get_ident() == self.thread and (name in HOST_CALLS or moves_a_parameter):
            self.calls.append(name)
        return func(*args, **kwargs)


def test_sync_steps_make_no_host_copy_on_the_training_thread():
    model, events = wide_mlp(), []
    algorithm = sl.DiLoCo(sync_every=2, fragments=2, overlap_steps=1)
    with sl.Session(model, algorithm=algorithm, mailbox=sl.MemoryMailbox(), node_id="n", poll_seconds=0.005,
                    on_event=events.append) as session:  # fmt: skip
        spy = HostCopies(list(model.parameters()))
        for batch in batches(0, 12):
            sgd_step(model, batch, 0.05)  # the user's own step, outside the spy: it may do what it likes
            with spy:
                session.step(samples=4)
    sent = [e for e in events if e.kind == "contribution_sent"]
    applied = [e for e in events if e.kind == "commit_applied"]
    assert (
        len(sent) >= 10 and len(applied) >= 8
    )  # sync steps, and commits carried onto the model, were spied on
    assert spy.calls == []


class NewTensors(TorchDispatchMode):
    """Counts, on the thread that entered it, the operations that copy a tensor into new memory."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0
        self.thread = threading.get_ident()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if threading.get_ident() == self.thread and func.__name__.split(".")[0] in ("_to_copy", "clone"):
            self.copies += 1
        return func(*args, **(kwargs or {}))


def test_sync_steps_clone_into_held_buffers_and_allocate_nothing():
    """A fresh fragment-sized tensor costs a page fault per page on a CPU (and allocator traffic on a GPU):
    the node makes its clone buffers when it joins (engine/clones.py), and no sync step makes a new tensor."""
    model, events = wide_mlp(), []
    algorithm = sl.DiLoCo(sync_every=2, fragments=2, overlap_steps=1)
    with sl.Session(model, algorithm=algorithm, mailbox=sl.MemoryMailbox(), node_id="n", poll_seconds=0.005,
                    on_event=events.append) as session:  # fmt: skip
        spy = NewTensors()
        for batch in batches(0, 12):
            sgd_step(model, batch, 0.05)
            with spy:
                session.step(samples=4)
    assert len([e for e in events if e.kind == "contribution_sent"]) >= 10
    assert spy.copies == 0


def test_fragments_of_any_shapes_share_the_buffers_of_the_contributions_in_flight():
    """With one contribution in flight, a node holds one fragment of clones, not a whole model of them: any
    fragment's snapshot is laid out in the buffer of a settled one, whatever its tensors' shapes."""
    torch.manual_seed(0)
    widths = [3, 5, 4, 6, 2]  # four fragments of four different layouts
    model = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False)])
    algorithm = sl.DiLoCo(sync_every=4, fragments=4, in_flight=1, overlap_steps=0)
    events = []
    with sl.Session(model, algorithm=algorithm, mailbox=sl.MemoryMailbox(), node_id="n", poll_seconds=0.005,
                    on_event=events.append) as session:  # fmt: skip
        spy, buffers = NewTensors(), set()
        for _ in range(16):
            model(torch.randn(4, 3)).pow(2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.05 * p.grad
                    p.grad = None
            with spy:
                session.step(samples=4)
            buffers |= {id(b) for held in session.node.clones.held.values() for b in held.values()}
        assert len(session.plan) == 4 and session.node.clones.buffers() == 1
    assert len([e for e in events if e.kind == "contribution_sent"]) >= 12  # every fragment synced thrice
    assert spy.copies == 0 and len(buffers) == 1  # every snapshot went into the one buffer


class Crossings(TorchDispatchMode):
    """Records, on the thread that entered it, each operation that moves data between host memory and a tensor
    the other way from `.numpy()` and `.cpu()`: host memory made a tensor (torch.from_numpy, as_tensor, whose
    data a GPU must then copy in), and copies from one device to another."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.thread = threading.get_ident()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        moves = name in ("_to_copy", "copy_") and _devices(args, kwargs) > 1
        if threading.get_ident() == self.thread and (name == "lift_fresh" or moves):
            self.calls.append(name)
        return func(*args, **kwargs)


def _devices(args: tuple, kwargs: dict) -> int:
    """How many devices an operation's tensors and its `device=` name."""
    devices = {a.device for a in args if isinstance(a, torch.Tensor)}
    return len(devices | ({torch.device(kwargs["device"])} if kwargs.get("device") is not None else set()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "options",
    [{"overlap_steps": 0}, {"overlap_steps": 1}, {"overlap_steps": 1, "mixing": 0.5}],
    ids=["at-the-sync", "overlapped", "blended"],
)
def test_applying_a_commit_moves_nothing_between_host_and_device_on_the_training_thread(options, device):
    """The commit's parameters come to the device on the communication thread; the node's anchor lives
    there, and θ ← θ + (Θ_new − Θ_old + Δ) (or the blend) runs there: no host array enters the training
    thread, whether the node waits for the commit at its sync step, τ steps later, or blends it in."""
    model, events = wide_mlp().to(device), []
    algorithm = sl.DiLoCo(sync_every=2, fragments=2, **options)
    with sl.Session(model, algorithm=algorithm, mailbox=sl.MemoryMailbox(), node_id="n", poll_seconds=0.005,
                    on_event=events.append) as session:  # fmt: skip
        host_calls, crossings, applying = HostCopies(list(model.parameters())), Crossings(), 0
        for x, y in batches(0, 12):
            sgd_step(model, (x.to(device), y.to(device)), 0.05)
            seen = len(events)
            with host_calls, crossings:
                session.step(samples=4)
            applying += any(e.kind == "commit_applied" for e in events[seen:])  # emitted in step()
    assert applying >= 5  # steps that applied a commit were spied on
    assert host_calls.calls == [] and crossings.calls == []
    anchors = [params[name] for _, params in session.node.anchors.values() for name in params]
    assert all(isinstance(anchor, torch.Tensor) and anchor.device.type == device for anchor in anchors)


def test_the_spy_sees_a_host_copy_when_there_is_one():
    model = wide_mlp()
    spy = HostCopies(list(model.parameters()))
    with spy:
        next(model.parameters()).detach().cpu().numpy()
    assert spy.calls == ["cpu", "numpy"]


def test_the_crossings_spy_sees_host_memory_entering_torch():
    spy, host = Crossings(), next(wide_mlp().parameters()).detach().numpy()
    with spy:
        torch.from_numpy(host)
        torch.as_tensor(host)
    assert spy.calls == ["lift_fresh", "lift_fresh"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("encoding", ["F32", "BF16", "F8_E4M3", "F4"])
def test_a_contribution_encoded_on_the_device_has_the_bytes_of_the_host_path(encoding, device):
    """Δ = anchor − snapshot is taken, and (but for F4) encoded, where the model is (wire/on_device.py): the
    payload is byte for byte what numpy makes of the same snapshot on the host, and the node's Δ
    stays in its tensors on the device."""
    model, mailbox, deltas_kept = wide_mlp().to(device), sl.MemoryMailbox(), []
    algorithm = sl.DiLoCo(sync_every=2, fragments=1, overlap_steps=0, delta_dtype=encoding)

    sent = []

    def on_event(event: sl.Event) -> None:  # on the communication thread, once the payload is out
        if event.kind == "contribution_sent" and event.data["round"] == 1:
            deltas_kept.extend(session.node.outgoing[0].arrays.values())
            sent.append(
                session.courier.merger.own.kept[(0, 1)][1]
            )  # the lone node merges: it kept its payload

    with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id="n", poll_seconds=0.005,
                    on_event=on_event) as session:  # fmt: skip
        anchor = {name: p.detach().cpu().numpy().copy() for name, p in model.named_parameters()}
        for x, y in batches(0, 2):
            sgd_step(model, (x.to(device), y.to(device)), 0.05)
            snapshot = {name: p.detach().cpu().numpy().copy() for name, p in model.named_parameters()}
            session.step(samples=4)  # the second publishes round 1 and waits for its commit
    (stored,) = sent
    # The header as the node wrote it (the run's fields and the contribution's claims), framing and all.
    header = {
        k: v for k, v in payload.read_header(stored).items() if k not in ("format", "encoding", "shapes")
    }
    on_host = payload.pack(
        {name: anchor[name] - snapshot[name] for name in anchor}, header, encoding=encoding
    )
    assert stored == on_host
    assert len(deltas_kept) == len(anchor)
    assert all(isinstance(delta, torch.Tensor) and delta.device.type == device for delta in deltas_kept)
