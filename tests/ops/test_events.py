"""Events as a stable stream: every kind the code emits is documented with its fields and level; each
event reaches the callback, the "slowlink" logger at its level, and the JSON-lines file; session.metrics()
and the TensorBoard adapter give the same figures as session.stats."""

import ast
import logging
import re
from pathlib import Path

import pytest

import slowlink as sl
from slowlink.events import LEVELS, JsonLines, level_of, read_events
from tests.session.nodes import batches, run_nodes, sgd_step, tiny_mlp

ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(sl.__file__).parent


def emitted_kinds() -> dict[str, set[str]]:
    """Every kind that an `Event(kind, node, message, data)` in the package can carry, with the data keys
    written beside it (a kind chosen by `a if c else b` counts both)."""
    kinds: dict[str, set[str]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Event" and node.args):
                continue
            first = node.args[0]
            options = [first.orelse, first.body] if isinstance(first, ast.IfExp) else [first]
            assert all(isinstance(o, ast.Constant) for o in options), f"{path}:{node.lineno}: a computed kind"
            data = node.args[3] if len(node.args) > 3 else None
            fields = {k.value for k in data.keys} if isinstance(data, ast.Dict) else set()
            for option in options:
                kinds.setdefault(option.value, set()).update(fields)
    return kinds


def documented_kinds() -> dict[str, tuple[str, set[str]]]:
    """kind -> (level, fields) from the table in docs/events.md."""
    rows = {}
    for line in (ROOT / "docs" / "events.md").read_text().splitlines():
        match = re.match(r"^\| `([a-z_]+)` \| ([A-Z]+) \|([^|]*)\|", line)
        if match:
            rows[match.group(1)] = (match.group(2), set(re.findall(r"`([a-z_]+)`", match.group(3))))
    return rows


def test_every_kind_the_code_emits_is_documented_with_its_fields_and_its_level():
    emitted, documented = emitted_kinds(), documented_kinds()
    assert len(emitted) >= 20  # the scan finds the events, or this test would pass on nothing
    assert set(emitted) == set(documented) == set(LEVELS), "docs/events.md, events.LEVELS and the code differ"
    for kind, fields in emitted.items():
        level, listed = documented[kind]
        assert fields == listed, (
            f"{kind}: the code writes {sorted(fields)}, docs/events.md lists {sorted(listed)}"
        )
        assert logging.getLevelName(level_of(kind)) == level, kind


def test_each_event_reaches_the_callback_the_logger_at_its_level_and_the_json_lines_file(tmp_path, caplog):
    seen: list[sl.Event] = []
    file = tmp_path / "events.jsonl"
    caplog.set_level(logging.DEBUG, logger="slowlink")
    # 10 steps with H=4, a barrier at each sync, no flush: the 2 steps after the last sync are dropped.
    run_nodes(
        1,
        sl.DiLoCo(sync_every=4, overlap_steps=0),
        sl.MemoryMailbox(),
        10,
        on_event=seen.append,
        events_file=file,
    )
    lines = read_events(file)

    # Two threads emit (training and communication): each sink sees every event, in its own order.
    def key(kind, node, message, data, time):
        return (time, kind, node, message, repr(data))

    assert sorted(key(e.kind, e.node, e.message, e.data, e.time) for e in seen) == sorted(
        key(line["kind"], line["node"], line["message"], line["data"], line["time"]) for line in lines
    )
    logged = [record for record in caplog.records if hasattr(record, "event")]
    assert sorted(id(record.event) for record in logged) == sorted(id(e) for e in seen)
    assert all(record.levelno == level_of(record.event.kind) for record in logged)
    kinds = {e.kind for e in seen}
    assert {"run_created", "contribution_sent", "commit_applied", "steps_dropped", "left"} <= kinds
    dropped = next(record for record in logged if record.event.kind == "steps_dropped")
    assert dropped.levelno == logging.WARNING and dropped.event.data == {"steps": 2}


def test_user_figures_go_into_the_same_file_and_a_line_cut_short_is_skipped(tmp_path):
    file = tmp_path / "events.jsonl"
    log = JsonLines(file)
    log.scalars(node="node-0", step=3, loss=2.5, accuracy=float("nan"))
    with open(file, "a") as out:
        out.write('{"time": 1, "kind": "joi')  # a process killed mid-line
    log(sl.Event("left", "node-0", "left after 3 steps", {"steps": 3}))
    records = read_events(file)
    assert [r["kind"] for r in records] == ["scalars", "left"]
    assert records[0]["data"] == {"step": 3, "loss": 2.5, "accuracy": None}


def test_metrics_agree_with_the_stats_and_measure_waiting_and_staleness():
    model = tiny_mlp()
    algorithm = sl.DiLoCo(sync_every=2, overlap_steps=0)  # waits for every round: utilization below 1
    with sl.Session(model, algorithm=algorithm, mailbox=sl.MemoryMailbox(), poll_seconds=0.005) as session:
        with pytest.raises(KeyError):
            session.metrics()["no such metric"]
        for batch in batches(0, 6):
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
        metrics, stats = session.metrics(), session.stats
    for name in ("step", "samples", "bytes_sent", "bytes_received", "commits_applied", "contributions_sent"):
        assert metrics[name] == getattr(stats, name), name
    assert metrics["step"] == 6 and metrics["commits_applied"] == 3
    assert metrics["staleness_rounds"] == 0 and metrics["staleness_steps"] == 0  # every round committed
    assert 0.0 <= metrics["seconds_since_commit"] < 30
    assert 0.0 < metrics["utilization"] < 1.0
    assert all(value is None or isinstance(value, int | float) for value in metrics.values())


def test_metrics_before_the_session_is_entered_say_when_they_are_available():
    session = sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=2), mailbox=sl.MemoryMailbox())
    with pytest.raises(sl.SessionStateError, match="once the Session is entered"):
        session.metrics()


def test_the_tensorboard_adapter_writes_the_metrics_and_event_counts_a_summary_writer_reads_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from slowlink.ops.tensorboard import TensorBoardMetrics

    board = TensorBoardMetrics(SummaryWriter(str(tmp_path)))
    model = tiny_mlp()
    logged = []
    with sl.Session(model, algorithm=sl.DiLoCo(sync_every=2), mailbox=sl.MemoryMailbox(), on_event=board,
                    poll_seconds=0.005) as session:  # fmt: skip
        for step, batch in enumerate(batches(0, 8), start=1):
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
            if step % 4 == 0:
                logged.append(board.log(session))
    # Once more after leaving, which waited for the rounds in flight: every upload's event has come by then (on
    # a busy machine, none may have come by step 8).
    logged.append(board.log(session))
    board.close()
    accumulator = EventAccumulator(str(tmp_path))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"slowlink/bytes_sent", "slowlink/utilization", "slowlink/events/contribution_sent"} <= tags
    sent = accumulator.Scalars("slowlink/bytes_sent")
    assert [(point.step, point.value) for point in sent] == [(m["step"], m["bytes_sent"]) for m in logged]
    assert accumulator.Scalars("slowlink/step")[-1].value == 8
    assert accumulator.Scalars("slowlink/events/run_created")[0].value == 1
