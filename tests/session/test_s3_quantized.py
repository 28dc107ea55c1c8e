"""Two learner processes over a real S3 server (moto on 127.0.0.1): 4-bit, zstd-compressed contributions
reach about the loss of the same run in float32 while uploading at least 7× fewer bytes."""

import json
import subprocess
import sys
import uuid
from pathlib import Path

import slowlink as sl
from slowlink.demo.corpus import heldout_windows, load_corpus
from slowlink.demo.model import build_model, evaluate

WORKER = Path(__file__).with_name("worker_process.py")
STEPS = 300
# Standard DiLoCo with a barrier and both nodes in every round: each run is deterministic, so the two
# runs differ only by how their contributions travel.
ALGORITHM = {"sync_every": 20, "fragments": 2, "quorum_size": 2, "overlap_steps": 0, "outer_lr": 1.0,
             "outer_momentum": 0.0}  # fmt: skip


def train_pair(
    endpoint, tmp_path: Path, name: str, compression: str | None, **wire
) -> tuple[float, list[dict]]:
    """Two workers over a fresh prefix of the bucket; returns the committed model's held-out loss and results."""
    s3 = {"url": endpoint.url, "bucket": endpoint.bucket, "region": endpoint.region,
          "prefix": f"slowlink-tests/{uuid.uuid4().hex}"}  # fmt: skip
    procs = []
    for node in range(2):
        args = {"s3": s3, "node": node, "steps": STEPS, "batch": 1, "algorithm": ALGORITHM | wire,
                "compression": compression, "wait_for_nodes": 2}  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), json.dumps(args), str(tmp_path / f"{name}{node}.json")]
            )
        )
    for proc in procs:
        assert proc.wait(timeout=240) == 0
    model = build_model("tiny", seed=0)
    sl.align(
        model, mailbox=sl.S3Mailbox(s3["bucket"], s3["prefix"], endpoint_url=s3["url"], region=s3["region"])
    )
    loss = evaluate(model, heldout_windows(load_corpus()))
    return loss, [json.loads((tmp_path / f"{name}{node}.json").read_text()) for node in range(2)]


def test_f4_zstd_contributions_train_about_as_well_as_f32_for_7x_fewer_bytes(s3_endpoint, tmp_path):
    start = evaluate(build_model("tiny", seed=0), heldout_windows(load_corpus()))
    f32_loss, f32 = train_pair(s3_endpoint, tmp_path, "f32", None)
    f4_loss, f4 = train_pair(s3_endpoint, tmp_path, "f4", "zstd", delta_dtype="F4", error_feedback=True)
    print(f"held-out loss: start {start:.4f}, F32 {f32_loss:.4f}, F4+zstd {f4_loss:.4f}")
    assert f32_loss < start - 0.5
    assert abs(f4_loss - f32_loss) < 0.03, (f32_loss, f4_loss)
    for run in (f32, f4):
        assert all(r["final_is_committed"] and r["stats"]["contributions_rejected"] == 0 for r in run)
    # The same syncs went out in both runs, every one merged: the bytes compare like for like.
    sent = [r["stats"]["contributions_sent"] for r in f32]
    assert sent == [r["stats"]["contributions_sent"] for r in f4] and min(sent) >= STEPS // 20 * 2 - 2
    assert all(r["stats"]["contributions_late"] == 0 for r in f32 + f4)
    f32_bytes = sum(r["contribution_bytes"] for r in f32)
    f4_bytes = sum(r["contribution_bytes"] for r in f4)
    print(f"contribution bytes: F32 {f32_bytes}, F4+zstd {f4_bytes} ({f32_bytes / f4_bytes:.2f}x fewer)")
    assert f32_bytes >= 7 * f4_bytes
