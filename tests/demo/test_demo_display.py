"""What `slowlink demo` draws, on a console that is not a terminal (a pipe, a file): each live view ends
on its own line, and no table is cut at 80 columns."""

import io

from slowlink.demo.report import LiveView, node_table, print_report, summary_table
from slowlink.demo.run import Curve, DemoConfig, DemoResult, PhaseResult
from slowlink.ops.console import make_console

STATS = {
    "step": 600, "commits_applied": 48, "rounds_merged": 48, "bytes_sent": 123_456_789,
    "bytes_received": 234_567_890, "requests": 4_321, "steps_dropped": 0, "contributions_rejected": 0,
    "contributions_late": 3, "is_leader": True,
}  # fmt: skip


def a_result(mailbox=None, workers=4) -> DemoResult:
    curve = Curve(samples=[0, 2400, 4800], wall=[0.0, 60.0, 120.0], loss=[5.5, 3.1, 2.6])
    nodes = [f"node-{i}" for i in range(workers)]
    distributed = PhaseResult("distributed", nodes, 120.0, 230.0, 4800, curve,
                              {n: dict(STATS, is_leader=n == "node-0") for n in nodes}, [], 2.55)  # fmt: skip
    alone = PhaseResult("alone", ["alone"], 200.0, 199.0, 4800, curve, {}, [], 2.7)
    config = DemoConfig(workers=workers, mailbox=mailbox, out="/tmp/slowlink-demo-out")
    corpus = {"sha256": "ab" * 32, "bytes": 1_000_000, "files": 10, "python": "3.11.2"}
    return DemoResult(config, 812_000, corpus, distributed, alone, 2.9)


def piped():
    buffer = io.StringIO()
    return make_console(buffer), buffer


def test_each_live_view_ends_on_its_own_line_before_the_next_one_starts():
    console, buffer = piped()
    view = LiveView(console)
    view.begin("2 nodes, DiLoCo through a directory mailbox", ["node-0", "node-1"], 10)
    view.update({"kind": "progress", "node": "node-0", "step": 3, "loss": 2.0, "stats": dict(STATS)})
    view.update({"kind": "done", "node": "node-1", "stats": {}})
    view.begin("one process alone, as many samples", ["alone"], 20)
    view.update({"kind": "done", "node": "alone", "stats": {}})
    view.end()
    lines = buffer.getvalue().splitlines()
    assert "node-1: done" in lines and "alone: done" in lines  # whole lines, nothing run into them
    assert any(line.startswith("one process alone, as many samples") for line in lines)
    assert buffer.getvalue().endswith("\n")


def test_piped_tables_are_not_cut_however_many_nodes_and_however_long_the_numbers():
    console, buffer = piped()
    result = a_result(workers=6)
    console.print(summary_table(result))
    console.print(node_table(result))
    view = LiveView(console)
    view.begin("6 nodes, DiLoCo through a directory mailbox", result.distributed.nodes, 600)
    for node in result.distributed.nodes:
        view.update({"kind": "progress", "node": node, "step": 300, "loss": 2.0, "stats": dict(STATS)})
    view.end()
    text = buffer.getvalue()
    assert "…" not in text
    assert "rounds committed" in text and "received" in text and "contributions late" in text
    assert max(len(line) for line in text.splitlines()) > 80  # wider than 80 columns, and whole
    assert "node-5 " in text and "123.5 MB" in text


def test_the_report_says_where_the_run_is_kept_for_status_and_report():
    console, buffer = piped()
    print_report(console, a_result(mailbox="/data/run-1"), png="/tmp/slowlink-demo-out/loss.png")
    text = buffer.getvalue()
    assert "slowlink status /data/run-1" in text
    assert "slowlink report /data/run-1 --events /tmp/slowlink-demo-out/events-*.jsonl" in text
    console, buffer = piped()
    print_report(console, a_result(), png="loss.png")
    assert "pass --mailbox PATH to keep it" in buffer.getvalue()
