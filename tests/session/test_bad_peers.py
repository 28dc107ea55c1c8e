"""Bad peers: a node that sends NaNs, an oversized delta, a delta for another schema, a replayed old
contribution, or a norm far beyond the others'. Each time the round commits from the honest nodes alone,
the commit records the reason, and the model stays finite."""

import time

import numpy as np
import pytest
import torch

import slowlink as sl
from slowlink.protocol import contribution, keys, records
from slowlink.protocol.run import read_commit, read_run

from .nodes import batches, sgd_step, tiny_mlp
from .test_nothing_lost import raw_payload, shapes


def plant(mailbox, node: str, arrays: dict, *, round_: int = 1, header: dict | None = None, norm: float = 0.0,
          record_round: int | None = None, samples: int = 4) -> None:  # fmt: skip
    """Write a contribution to fragment 0 as a (bad) node would, bypassing every check of the encoder."""
    run = read_run(mailbox)
    recorded = round_ if record_round is None else record_round
    claims = {
        "base": recorded - 1,
        "samples": samples,
        "steps": 2,
        "final": False,
        "step_seconds": 0.01,
        "norm": norm,
    }
    where = header or run.expect(kind="delta", fragment=0, round=recorded, node=node)
    data = raw_payload(arrays, where | {contribution.CLAIMS: records.encode(claims).decode()})
    mailbox.put(keys.contribution(0, round_, node), data)


def honest_round_with(bad, **options) -> tuple[dict, list[torch.nn.Module], sl.MemoryMailbox]:
    """Two honest nodes train one round (H=2) while `bad(mailbox, run)` plants a contribution to it."""
    mailbox = sl.MemoryMailbox()
    # grace_seconds: the round waits for both honest nodes, so the bad one is judged among three.
    algorithm = sl.DiLoCo(sync_every=2, grace_seconds=30.0, outer_lr=1.0, outer_momentum=0.0, **options)
    models = [tiny_mlp(), tiny_mlp()]
    with sl.Session(
        models[0], algorithm=algorithm, mailbox=mailbox, node_id="good-0", poll_seconds=0.005
    ) as a:
        with sl.Session(
            models[1], algorithm=algorithm, mailbox=mailbox, node_id="good-1", poll_seconds=0.005
        ) as b:
            bad(mailbox, read_run(mailbox))
            for batch_a, batch_b in zip(batches(0, 2), batches(1, 2), strict=True):
                sgd_step(models[0], batch_a, 0.1)
                a.step(samples=4)
                sgd_step(models[1], batch_b, 0.1)
                b.step(samples=4)
            deadline = time.monotonic() + 30
            while read_commit(mailbox, 0, 1) is None and time.monotonic() < deadline:
                time.sleep(0.005)
    record = read_commit(mailbox, 0, 1)
    assert record is not None, "round 1 never committed"
    return record, models, mailbox


def zeros(run, scale: float = 0.0) -> dict:
    return {name: np.full(shape, scale, np.float32) for name, shape in shapes(run).items()}


CASES = {
    "NaN values": (lambda mailbox, run: plant(mailbox, "bad", zeros(run, np.nan)), "NaN or infinite"),
    "infinite values": (lambda mailbox, run: plant(mailbox, "bad", zeros(run, np.inf)), "NaN or infinite"),
    "oversized": (
        lambda mailbox, run: plant(
            mailbox, "bad", zeros(run) | {"padding": np.zeros(run.max_payload_bytes(0) // 4, np.float32)}
        ),
        "so it was not read",
    ),
    "another schema": (
        lambda mailbox, run: plant(
            mailbox,
            "bad",
            zeros(run),
            header=run.expect(kind="delta", fragment=0, round=1, node="bad") | {"schema": "0" * 64},
        ),
        "payload schema",
    ),
    "replayed from round 0 to 1": (
        lambda mailbox, run: plant(mailbox, "bad", zeros(run), record_round=2),
        "sits at fragment 0 round 1",
    ),
    "norm 1000x the others'": (
        lambda mailbox, run: plant(mailbox, "bad", zeros(run, 50.0), norm=0.01),
        "the median norm of the round's 2 other contributions",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_contribution_is_left_out_with_its_reason_and_the_model_stays_finite(case):
    bad, reason = CASES[case]
    record, models, mailbox = honest_round_with(bad)
    assert sorted(c["node"] for c in record["contributors"]) == ["good-0", "good-1"]
    assert [r["node"] for r in record["rejected"]] == ["bad"] and reason in record["rejected"][0]["reason"], (
        record
    )
    for model in models:
        assert all(torch.isfinite(p).all() for p in model.parameters())
    committed = tiny_mlp(seed=3)
    sl.align(committed, mailbox=mailbox)
    assert all(torch.isfinite(p).all() for p in committed.parameters())


def test_a_trimmed_mean_merges_a_huge_contribution_without_being_moved_by_it():
    # The norm check off: the robust merge alone must hold. Of three, trim=0.34 keeps each coordinate's median.
    record, models, mailbox = honest_round_with(
        lambda mailbox, run: plant(mailbox, "bad", zeros(run, 1e6)), merge=sl.TrimmedMean(trim=0.34),
        max_norm_ratio=None,
    )  # fmt: skip
    assert sorted(c["node"] for c in record["contributors"]) == ["bad", "good-0", "good-1"]
    committed = tiny_mlp(seed=3)
    sl.align(committed, mailbox=mailbox)
    start = tiny_mlp()
    replicas = [tiny_mlp(), tiny_mlp()]  # the honest nodes' round, replayed: their own Θ0 − Δ_m
    for node, replica in enumerate(replicas):
        for batch in batches(node, 2):
            sgd_step(replica, batch, 0.1)
    # Θ = Θ0 − median(Δ): each committed value lies between the two honest nodes' own values.
    for name, value in committed.named_parameters():
        honest = torch.stack([dict(replica.named_parameters())[name] for replica in replicas])
        low, high = honest.min(dim=0).values, honest.max(dim=0).values
        assert (value >= low - 1e-6).all() and (value <= high + 1e-6).all(), name
        assert not torch.equal(value, dict(start.named_parameters())[name])
