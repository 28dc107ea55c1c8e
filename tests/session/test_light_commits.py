"""A run is as light as its encoding: with 4-bit deltas a commit is its 4-bit change (the full parameters go
out as a snapshot every few rounds), so the store's traffic falls with the deltas', not 1.4× as before.
Two processes over moto's S3 server, a 1.1M-parameter model, 20 rounds."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import slowlink as sl

WORKER = Path(__file__).with_name("light_worker.py")
ROUNDS, SYNC_EVERY = 20, 5


def run_pair(s3_endpoint, tmp_path: Path, name: str, algorithm: dict, compression: str | None) -> list[dict]:
    s3 = {"url": s3_endpoint.url, "bucket": s3_endpoint.bucket, "region": s3_endpoint.region,
          "prefix": f"light/{uuid.uuid4().hex}"}  # fmt: skip
    procs, outs = [], []
    for node in range(2):
        out = tmp_path / f"{name}-{node}.json"
        args = {"s3": s3, "node": node, "steps": ROUNDS * SYNC_EVERY, "compression": compression,
                "algorithm": {"sync_every": SYNC_EVERY, "quorum_size": 2, "overlap_steps": 0, **algorithm}}  # fmt: skip
        procs.append(
            subprocess.Popen([sys.executable, str(WORKER), json.dumps(args), str(out)], env=dict(os.environ))
        )
        outs.append(out)
    for proc in procs:
        assert proc.wait(timeout=300) == 0
    return [json.loads(out.read_text()) for out in outs]


@pytest.fixture(scope="module")
def runs(s3_endpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("light")
    return {
        "F32": run_pair(s3_endpoint, tmp, "f32", {}, None),
        "F4": run_pair(s3_endpoint, tmp, "f4", {"delta_dtype": "F4"}, "zstd"),
    }


def test_four_bit_deltas_make_the_whole_run_seven_times_lighter(runs):
    written = {name: sum(node["bytes_sent"] for node in nodes) for name, nodes in runs.items()}
    read = {name: sum(node["bytes_received"] for node in nodes) for name, nodes in runs.items()}
    assert written["F32"] / written["F4"] >= 7, written
    assert read["F32"] / read["F4"] >= 6, read
    for nodes in runs.values():
        assert all(node["commits_applied"] == ROUNDS for node in nodes)


def test_the_merger_sends_at_most_three_times_what_a_learner_sends(runs):
    for name, nodes in runs.items():
        merger, learner = sorted(nodes, key=lambda node: -node["rounds_merged"])
        assert merger["rounds_merged"] == ROUNDS and learner["rounds_merged"] == 0
        if name == "F4":  # with float32 commits the full parameters and momentum go out every round
            assert merger["bytes_sent"] <= 3 * learner["bytes_sent"], (merger, learner)


def test_the_light_run_trains_as_well(runs):
    f32 = sum(node["held_out"] for node in runs["F32"]) / 2
    f4 = sum(node["held_out"] for node in runs["F4"]) / 2
    assert abs(f4 - f32) <= 0.01 * f32, (f32, f4)
    assert runs["F4"][0]["held_out"] == runs["F4"][1]["held_out"]  # both nodes end on the same commit


def test_at_steady_state_snapshots_add_at_most_half_a_change_and_the_merger_sends_under_three_times_a_learner():
    from slowlink.protocol.run import get_blob, read_commit, read_head

    from .nodes import run_nodes, wide_mlp

    mailbox = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=1, quorum_size=2, overlap_steps=0, delta_dtype="F4")
    _, stats = run_nodes(2, algorithm, mailbox, 70, make_model=wide_mlp, lr=0.01)
    head, _ = read_head(mailbox, 1)
    records = [read_commit(mailbox, 0, round_) for round_ in range(1, head[0] + 1)]
    snapshots = [round_ for round_, record in enumerate(records, 1) if record["snapshot"]]
    assert snapshots and snapshots[0] > 1  # the first rounds build on the initial model: no snapshot needed
    interval = snapshots[1] - snapshots[0] if len(snapshots) > 1 else snapshots[0]
    size = lambda sha, record: len(get_blob(mailbox, sha, 1 << 30, record))  # noqa: E731  (inline or not)
    newest = records[snapshots[-1] - 1]  # the older snapshots' blobs are collected
    snapshot = size(newest["params"], newest) + size(newest["outer_state"], newest)
    change = size(records[-1]["change"], records[-1])
    assert snapshot / interval <= 0.5 * change * 1.05  # spread over its interval, a snapshot is half a change
    merger, learner = sorted(stats, key=lambda s: -s.rounds_merged)
    assert merger.rounds_merged == head[0] >= 2 * interval  # two intervals at least: steady state
    assert merger.bytes_sent <= 3 * learner.bytes_sent, (merger.bytes_sent, learner.bytes_sent)
