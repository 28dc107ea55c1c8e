"""The Weights & Biases adapter: a real offline run holds, at each logged step, exactly the figures of
session.metrics() and the event counts; without wandb, or without a run, the error names the fix."""

import json
import struct
import sys
import time

import pytest

import slowlink as sl
from slowlink.ops.wandb import WandbMetrics
from tests.session.nodes import batches, sgd_step, tiny_mlp


def history(path) -> list[dict] | None:
    """The history rows of an offline run's `.wandb` file, in order; None until the file ends with the
    run's exit record (wandb-core may still be writing it when run.finish() returns). wandb's reader of
    that file is in Go now, so this walks its framing here: a 7-byte header, then LevelDB-log chunks (crc,
    length, type) in 32 KiB blocks, each record one of wandb's own protobuf `Record`s."""
    from wandb.proto import wandb_internal_pb2

    raw, block = path.read_bytes(), 32768
    rows, record, at = [], b"", 7
    while at + 7 <= len(raw):
        if block - at % block < 7:  # a block's last bytes, too few for a chunk's header, are padding
            at += block - at % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[at : at + 7])
        if at + 7 + length > len(raw):
            return None  # a chunk still being written
        record, at = record + raw[at + 7 : at + 7 + length], at + 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            parsed = wandb_internal_pb2.Record()
            parsed.ParseFromString(record)
            record, what = b"", parsed.WhichOneof("record_type")
            if what == "exit":
                return rows
            if what == "history":
                # A key with "/" in it comes as its parts, in nested_key.
                items = parsed.history.item
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return None


def test_an_offline_run_holds_the_session_metrics_and_event_counts_at_each_logged_step(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # nothing written outside tmp_path
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    run = wandb.init(mode="offline", dir=tmp_path, project="slowlink-test",
                     settings=wandb.Settings(console="off", silent=True, x_disable_stats=True))  # fmt: skip
    try:
        board = WandbMetrics()  # the active run
        assert board.run is run
        model, logged = tiny_mlp(), []
        with sl.Session(model, algorithm=sl.DiLoCo(sync_every=2), mailbox=sl.MemoryMailbox(), on_event=board,
                        poll_seconds=0.005) as session:  # fmt: skip
            for step, batch in enumerate(batches(0, 8), start=1):
                sgd_step(model, batch, 0.1)
                session.step(samples=4)
                if step % 2 == 0:
                    logged.append(board.log(session))
                    assert logged[-1]["step"] == step and logged[-1]["samples"] == 4 * step
    finally:
        run.finish()
    with pytest.raises(sl.ConfigError, match=r"wandb\.init\(\.\.\.\) first"):
        WandbMetrics()  # the run is finished: none is active

    path, deadline = tmp_path / run.settings.sync_file, time.monotonic() + 30
    while (rows := history(path)) is None:
        assert time.monotonic() < deadline, f"{path} holds no exit record 30 s after run.finish()"
        time.sleep(0.05)
    assert [row["_step"] for row in rows] == [2, 4, 6, 8]
    previous: dict[str, int] = {}
    for row, metrics in zip(rows, logged, strict=True):
        figures = {k.removeprefix("slowlink/"): v for k, v in row.items() if k.startswith("slowlink/")}
        counts = {k.removeprefix("events/"): figures.pop(k) for k in list(figures) if k.startswith("events/")}
        assert figures == metrics  # every metric with a value, as session.metrics() gave it
        assert counts["run_created"] == 1
        assert all(counts.get(kind, 0) >= count for kind, count in previous.items())  # counts only grow
        assert all(counts[kind] <= board.events[kind] for kind in counts)
        previous = counts
    assert counts["contribution_sent"] >= 1 and "seconds_since_commit" in figures  # rounds were committed


def test_without_wandb_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now fails as if it were not installed
    with pytest.raises(sl.ConfigError, match="pip install wandb"):
        WandbMetrics()
