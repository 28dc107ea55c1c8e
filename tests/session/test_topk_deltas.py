"""delta_dtype=sl.TopK(...) in a real run over a mailbox, with two fragments: every round's commit moves the
model by the weighted mean of the nodes' decoded sparse Δs, and each node's residual holds exactly what its
sparse Δs have not yet sent."""

import threading

import numpy as np
import torch

import slowlink as sl
from slowlink.wire import payload

STEPS, H = 8, 2


class Recording(sl.MemoryMailbox):
    """Keeps every contribution's payload it is handed, and those a merger keeps to itself (`watch`):
    (node, fragment) -> the decoded Δs, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.deltas: dict[tuple[str, int], list[dict[str, np.ndarray]]] = {}
        self.sizes: list[int] = []

    def put(self, key, data, **options):
        if key.startswith("rounds/") and not key.endswith(".json"):  # a contribution's payload
            self.record(data)
        return super().put(key, data, **options)

    def record(self, data: bytes) -> None:
        arrays, header = payload.unpack(data)
        self.deltas.setdefault((header["node"], int(header["fragment"])), []).append(arrays)
        self.sizes.append(len(data))

    def watch(self, session: sl.Session) -> None:
        """Record what the session's merger keeps in memory instead of writing it, when it merges."""
        keep = session.courier.merger.remember_own

        def remember_own(record: dict, data: bytes) -> None:
            self.record(data)
            keep(record, data)

        session.courier.merger.remember_own = remember_own


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False))


def drift(node: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(node)
    return [0.01 * torch.randn(64, 64, generator=generator) for _ in range(2)]


def test_topk_deltas_commit_their_decoded_mean_and_keep_the_rest_as_residual():
    mailbox, topk = Recording(), sl.TopK(fraction=1 / 64, chunk=64, values="2bit")
    algorithm = sl.DiLoCo(sync_every=H, fragments=2, quorum_size=2, overlap_steps=0, outer_lr=1.0,
                          outer_momentum=0.0, delta_dtype=topk, commit_dtype="F32", flush_on_close=True)  # fmt: skip
    models, residuals, barrier = [model(), model()], {}, threading.Barrier(2)
    start = [p.detach().clone() for p in models[0].parameters()]

    def node(i: int) -> None:
        with sl.Session(models[i], algorithm=algorithm, mailbox=mailbox, node_id=f"node-{i}",
                        poll_seconds=0.005) as session:  # fmt: skip
            mailbox.watch(session)
            barrier.wait()
            for _ in range(STEPS):
                with torch.no_grad():
                    for p, d in zip(models[i].parameters(), drift(i), strict=True):
                        p -= d
                session.step(samples=1 + i)  # weights 1 and 2
        residuals[i] = session.courier.residual

    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    names = list(dict(models[0].named_parameters()))
    for q, name in enumerate(names):  # fragment q holds tensor q (one each)
        sent = [mailbox.deltas[(f"node-{i}", q)] for i in range(2)]
        rounds = len(sent[0])
        assert rounds == len(sent[1]) >= 3
        for deltas in sent:  # sparse: 1/64 of the one 64×64 chunk, 2-bit values on one scale
            assert all(
                int((d[name] != 0).sum()) == 64 and len(np.unique(np.abs(d[name]))) <= 3 for d in deltas
            )
        merged = sum((1 * a[name] + 2 * b[name]) / 3 for a, b in zip(*sent, strict=True))
        final = start[q].numpy() - merged  # outer SGD with lr 1: the commit is the anchor less the mean Δ
        for m in models:
            np.testing.assert_allclose(dict(m.named_parameters())[name].detach().numpy(), final, atol=1e-6)
        for i in range(
            2
        ):  # with the barrier and the last steps flushed, the true Δs add up to every step's drift
            truth = STEPS * drift(i)[q].numpy()
            np.testing.assert_allclose(
                residuals[i][q][name], truth - sum(d[name] for d in sent[i]), atol=1e-5
            )
    # each Δ of 4096 float32 values (16 KiB) travels in a payload of about 600 bytes, most of them its header
    # (the contribution's claims travel in it too: protocol v2, one object per contribution)
    assert max(mailbox.sizes) < 4 * 4096 / 25
