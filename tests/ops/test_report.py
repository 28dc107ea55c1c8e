"""`slowlink report`: one self-contained HTML page that a headless browser shows with its plots drawn,
for a finished run (history from summary.json) and for a run in progress (history from events files)."""

import re
import shutil
import subprocess
import time

import numpy as np
import pytest

import slowlink as sl
from slowlink.cli.main import main
from slowlink.events import JsonLines
from tests.ops.runs import paused_run
from tests.session.nodes import batches, sgd_step, tiny_mlp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (apt install chromium)"
)
WINDOW = (1280, 2000)
# Where the page draws its first plot (header 96 px, then the "rounds" heading; the plot is 960 px wide).
ROUNDS_PLOT = (slice(170, 680), slice(40, 960))  # rows, columns of the screenshot
MARGIN = (slice(100, 2000), slice(1100, 1280))  # below the header, right of the 960-px column: empty


def train_alone(mailbox, node_id: str, steps: int, events) -> None:
    model = tiny_mlp()
    algorithm = sl.DiLoCo(sync_every=2, overlap_steps=0)
    with sl.Session(model, algorithm=algorithm, mailbox=mailbox, node_id=node_id, poll_seconds=0.005,
                    events_file=events) as session:  # fmt: skip
        for step, batch in enumerate(batches(int(node_id[-1]), steps), start=1):
            loss = sgd_step(model, batch, 0.1)
            session.step(samples=4)
            JsonLines(events).scalars(node=node_id, step=step, loss=loss)


def browser(*arguments: str, cwd) -> str:
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={WINDOW[0]},{WINDOW[1]}", *arguments], capture_output=True,
                          text=True, timeout=120, cwd=cwd)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def ink(pixels: np.ndarray) -> float:
    """The share of pixels that are not (nearly) white."""
    return float((pixels[..., :3].min(axis=-1) < 0.94).mean())


@needs_chromium
def test_the_report_of_a_finished_run_shows_its_rounds_stall_leader_change_and_loss_in_a_browser(
    tmp_path, capsys
):
    from matplotlib.image import imread

    path, events = tmp_path / "run", tmp_path / "events.jsonl"
    mailbox = sl.DirMailbox(path)
    # node-0 trains and leaves; 2.5 s later node-1 carries on alone: one stall, one change of merger.
    train_alone(mailbox, "node-0", 10, events)
    time.sleep(2.5)
    train_alone(mailbox, "node-1", 10, events)
    assert main(["report", str(path), "--events", str(events), "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)  # loads nothing from anywhere
    assert page.count('src="data:image/png;base64,') == 3  # rounds, bytes, loss

    text = re.sub(r"<[^>]+>", " ", browser("--dump-dom", (tmp_path / "report.html").as_uri(), cwd=tmp_path))
    text = " ".join(text.split())
    assert "stalls: 1" in text and "leader changes: 1" in text
    assert "node-0 departed" in text and "node-1 departed" in text
    assert "10 commits from summary.json" in text
    assert "fragment round from to 0 6 node-0 node-1" in text  # node-0 merged rounds 1-5, node-1 from 6

    browser(f"--screenshot={tmp_path / 'shot.png'}", (tmp_path / "report.html").as_uri(), cwd=tmp_path)
    shot = imread(tmp_path / "shot.png")
    assert shot.shape[:2] == (WINDOW[1], WINDOW[0])
    plot = shot[ROUNDS_PLOT]
    assert ink(plot) > 0.03  # lines, dots, labels and the stall's shading are drawn
    assert (plot[..., :3].max(axis=-1) < 0.3).mean() < 0.2  # and it is not a black box
    colours = {tuple(pixel) for pixel in (plot[..., :3].reshape(-1, 3) * 8).round().astype(int)}
    assert len(colours) >= 6  # the fragment's line, the stall, the leader change, text: several colours
    assert ink(shot[MARGIN]) < 0.001


def test_the_report_of_a_run_in_progress_takes_its_rounds_from_the_events_files(tmp_path, capsys):
    path, events = tmp_path / "run", tmp_path / "events.jsonl"
    algorithm = sl.DiLoCo(sync_every=2, fragments=2)
    with paused_run(
        2, algorithm, sl.DirMailbox(path), steps=12, pause_at=8, events_file=events, lease_seconds=8
    ) as (
        sessions,
        _,
    ):
        sl.DirMailbox(path).delete(["summary.json"])  # a run from before summaries: the events tell it
        assert main(["report", str(path), "--events", str(events), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "from the events files" in page and "No loss logged" in page
    assert page.count('src="data:image/png;base64,') == 2  # rounds and bytes; no loss was logged
    rows = re.findall(r"<tr><td>(node-\d)[^<]*</td><td class=text>(\w+)</td><td>(\d+)</td>", page)
    # The leases say step 8, and were written within a lease by the store's clock: live, without watching
    assert sorted(rows) == [("node-0", "live", "8"), ("node-1", "live", "8")]


def test_a_report_without_history_or_events_still_names_the_run_and_says_what_is_missing(tmp_path, capsys):
    path = tmp_path / "run"
    train_alone(sl.DirMailbox(path), "node-0", 4, tmp_path / "unused.jsonl")
    sl.DirMailbox(path).delete(["summary.json"])
    assert main(["report", str(path), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "No history of rounds" in page and "node-0" in page
    assert main(["report", str(path), "--events", str(tmp_path / "missing.jsonl")]) == 1
    assert "no such file" in capsys.readouterr().err


def test_without_summary_json_the_events_give_the_timeline_and_its_changes_of_merger():
    from slowlink.ops.report import leader_changes_in, timeline_from_events

    def committed(time_, round_, merger):
        return {"time": time_, "kind": "round_merged", "node": merger,
                "data": {"fragment": 0, "round": round_, "contributors": ["a", "b"], "rejected": {}}}  # fmt: skip

    events = [committed(1.0, 1, "a"), committed(2.0, 2, "a"), committed(2.0, 2, "a"), committed(9.0, 3, "b")]
    timeline = timeline_from_events(events)  # the same commit reported twice counts once
    assert timeline == [
        [1.0, 0, 1, ["a", "b"], 0, "a"],
        [2.0, 0, 2, ["a", "b"], 0, "a"],
        [9.0, 0, 3, ["a", "b"], 0, "b"],
    ]
    assert leader_changes_in(timeline) == [{"time": 9.0, "fragment": 0, "round": 3, "from": "a", "to": "b"}]
