"""A commit's small blobs travel inside its record (records.INLINE_BYTES): a node reading the commit needs
no second request, and a merger taking over reads a small outer state from the commit that wrote it. A
larger fragment's parameters and outer state stay blobs of their own.
Whatever the record carries is checked as a blob is: by its digest, and as base64."""

import base64

import numpy as np
import pytest

from slowlink.algorithms.diloco import DiLoCo
from slowlink.errors import PayloadError
from slowlink.mailbox.memory import MemoryMailbox
from slowlink.protocol import contribution, keys, records
from slowlink.protocol.chain import params_at
from slowlink.protocol.merger import Merger
from slowlink.protocol.records import INLINE_BYTES
from slowlink.protocol.run import get_blob, inlined, open_run, read_commit, read_run
from slowlink.wire import payload


def merged_rounds(size: int, rounds: int, **options):
    """A merger commits `rounds` rounds of one fragment, one tensor of `size` values, each round Δ = 1 from
    node n; returns the mailbox, the run and the parameters of each commit."""
    algorithm = DiLoCo(sync_every=10, outer_lr=1.0, outer_momentum=0.5, **options)
    mailbox = MemoryMailbox()
    run, _ = open_run(mailbox, config=algorithm.to_dict(), schema=[("w", (size,), "float32")],
                      schema_digest="0" * 64, plan=[["w"]], initial=lambda: [{"w": np.zeros(size, np.float32)}])  # fmt: skip
    merger = Merger(mailbox, run, algorithm, "m", emit=lambda event: None, clock=lambda: 0.0)
    merger.looks.look_seconds = 0.0
    params, committed = {"w": np.zeros(size, np.float32)}, []
    for round_ in range(1, rounds + 1):
        claims = {
            "base": round_ - 1,
            "samples": 1,
            "steps": 1,
            "final": False,
            "step_seconds": 0.1,
            "norm": 1.0,
        }
        delta = {"w": np.linspace(0.5, 1.5, size, dtype=np.float32)}
        header = contribution.header(run, 0, round_, "n", claims)
        mailbox.put(keys.contribution(0, round_, "n"), payload.pack(delta, header))
        [done] = merger.step({0: (round_ - 1, params)}, lambda fresh: {"n"}, [round_ - 1])
        params = done.params
        committed.append(params)
    return mailbox, run, committed


def test_a_small_fragments_commits_carry_their_parameters_and_a_joiner_rebuilds_them_from_the_records():
    mailbox, run, committed = merged_rounds(4, 3)
    for round_ in (1, 2, 3):
        record = read_commit(mailbox, 0, round_)
        # Round 1 writes the outer state too (a merger's first commit does); the later ones name it.
        carried = [record["params"]] + ([record["outer_state"]] if round_ == 1 else [])
        assert [sha for sha, _ in record["inline"]] == carried
        assert all(mailbox.get(keys.blob(sha)) is None for sha in carried)  # no blob of their own
        assert record["outer_state"] is not None and record.get("outer_round", 1) == 1
        np.testing.assert_array_equal(params_at(mailbox, run, 0, round_)["w"], committed[round_ - 1]["w"])
    assert not mailbox.list("blobs/")  # the initial model is in run.json


def test_a_lossy_commits_small_change_travels_inline_and_the_chain_rebuilds_through_it():
    mailbox, run, committed = merged_rounds(4, 3, commit_dtype="BF16", snapshot_every=8)
    changes = [read_commit(mailbox, 0, round_) for round_ in (2, 3)]
    assert all(not r["snapshot"] and [sha for sha, _ in r["inline"]] == [r["change"]] for r in changes)
    assert all(mailbox.get(keys.blob(r["change"])) is None for r in changes)
    np.testing.assert_array_equal(params_at(mailbox, run, 0, 3)["w"], committed[-1]["w"])


def test_parameters_over_the_inline_limit_are_a_blob_of_their_own():
    size = INLINE_BYTES // 4 + 1
    mailbox, run, committed = merged_rounds(size, 1)
    record = read_commit(mailbox, 0, 1)
    assert "inline" not in record and mailbox.get(keys.blob(record["params"])) is not None
    np.testing.assert_array_equal(params_at(mailbox, run, 0, 1)["w"], committed[0]["w"])


def test_inline_bytes_that_are_not_the_blob_named_or_not_base64_are_refused_with_the_reason():
    mailbox, run, _ = merged_rounds(4, 1)
    record = read_commit(mailbox, 0, 1)
    sha = record["params"]
    other = payload.pack({"w": np.ones(4, np.float32)}, run.expect(kind="params", fragment=0, round=1))
    forged = record | {"inline": [[sha, base64.b64encode(other).decode()]]}
    with pytest.raises(PayloadError, match="digest"):
        params_at(mailbox, run, 0, 1, record=forged)
    with pytest.raises(PayloadError, match="not base64"):
        get_blob(mailbox, sha, 1 << 20, record | {"inline": [[sha, "@@@@"]]})
    with pytest.raises(PayloadError, match="over 16 bytes"):
        get_blob(mailbox, sha, 16, record)
    # A record whose `inline` is not [sha, base64] pairs fails its checks before anyone reads it.
    with pytest.raises(PayloadError, match="inline"):
        records.decode(records.encode(record | {"inline": [["x", 1]]}), records.COMMIT_FIELDS, what="commit")


def open_fragments(mailbox, fragments: int, size: int):
    """A run of `fragments` tensors of `size` values each, one a fragment, tensor q full of q."""
    names = [f"t{q}" for q in range(fragments)]
    return open_run(mailbox, config=DiLoCo(sync_every=10).to_dict(), schema=[(n, (size,), "float32") for n in names],
                    schema_digest="0" * 64, plan=[[n] for n in names],
                    initial=lambda: [{n: np.full(size, q, np.float32)} for q, n in enumerate(names)])  # fmt: skip


def test_the_initial_model_travels_in_run_json_up_to_its_limit_and_the_rest_as_blobs():
    size = INLINE_BYTES // 4 - 256  # each fragment, with its header, just under the limit of one inline blob
    fragments = records.RUN_INLINE_BYTES // INLINE_BYTES + 3
    mailbox = MemoryMailbox()
    run, created = open_fragments(mailbox, fragments, size)
    assert created
    carried = inlined(run.initial_record)
    assert 0 < len(carried) < fragments
    assert sum(len(base64.b64decode(text)) for _, text in run.inline) <= records.RUN_INLINE_BYTES
    assert {found.key for found in mailbox.list("blobs/")} == {
        keys.blob(sha) for sha in run.initial if sha not in carried
    }
    joined = read_run(mailbox)  # a joiner reads each fragment from run.json or its blob, checked alike
    for q in range(fragments):
        np.testing.assert_array_equal(params_at(mailbox, joined, q, 0)[f"t{q}"], np.full(size, q, np.float32))
    sha, _ = joined.inline[0]
    other = payload.pack({"t0": np.ones(size, np.float32)}, run.expect(kind="params", fragment=0, round=0))
    joined.inline[0] = [sha, base64.b64encode(other).decode()]
    with pytest.raises(PayloadError, match="digest"):
        params_at(mailbox, joined, 0, 0)


def test_an_initial_model_that_would_make_run_json_too_large_for_a_record_is_written_as_blobs(monkeypatch):
    monkeypatch.setattr(records, "MAX_RECORD_BYTES", 100_000)  # as a schema of very many tensors would
    mailbox = MemoryMailbox()
    run, _ = open_fragments(mailbox, 4, INLINE_BYTES // 8)
    assert run.inline == [] and len(mailbox.get(keys.RUN).data) <= 100_000
    assert len(mailbox.list("blobs/")) == 4
    for q in range(4):
        np.testing.assert_array_equal(
            params_at(mailbox, read_run(mailbox), q, 0)[f"t{q}"], np.full(INLINE_BYTES // 8, q)
        )
