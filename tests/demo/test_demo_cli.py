"""The `slowlink demo` command: its options, its errors, and a short real run of several processes."""

import json
import math
import os
import re
import subprocess
import sys

import pytest

import slowlink
from slowlink.cli.main import main
from slowlink.demo.run import Curve, DemoConfig

DEMO_OPTIONS = [
    "--steps",
    "--workers",
    "--sync-every",
    "--fragments",
    "--batch-size",
    "--quorum",
    "--mailbox",
    "--out",
    "--model",
    "--seed",
]


def test_demo_help_lists_exactly_these_options(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["demo", "--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    # Pinned so that a renamed or removed option is a deliberate change (STYLE.md rule 13).
    assert set(re.findall(r"--[a-z][a-z-]*", text)) == {*DEMO_OPTIONS, "--help"}
    assert "{small,tiny}" in text and "steps between syncs (" in text


def test_slowlink_without_a_command_explains_itself(capsys):
    assert main([]) == 2
    assert "demo" in capsys.readouterr().err


def test_conflicting_options_fail_with_a_message_that_names_both(capsys):
    assert main(["demo", "--sync-every", "4", "--fragments", "5"]) == 1
    error = capsys.readouterr().err
    assert "--fragments 5" in error and "--sync-every 4" in error


def test_a_non_empty_mailbox_folder_is_refused_before_any_process_starts(tmp_path, capsys):
    (tmp_path / "old-run.json").write_text("{}")
    assert main(["demo", "--model", "tiny", "--mailbox", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    assert "is not empty" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_config_rejects_steps_below_one():
    with pytest.raises(slowlink.ConfigError, match="--steps 0 must be at least 1"):
        DemoConfig(steps=0)


def test_a_quorum_beyond_the_node_count_is_refused_with_both_named(capsys):
    assert main(["demo", "--workers", "2", "--quorum", "3"]) == 1
    error = capsys.readouterr().err
    assert "--quorum 3" in error and "--workers 2" in error
    with pytest.raises(slowlink.ConfigError, match="--quorum 0 must be between 1 and --workers 2"):
        DemoConfig(quorum=0)


def test_loss_at_equal_wall_time_interpolates_linearly_and_clamps_at_the_ends():
    curve = Curve(samples=[0, 10, 20], wall=[0.0, 10.0, 30.0], loss=[5.0, 3.0, 2.0])
    assert curve.loss_at_wall(5.0) == pytest.approx(4.0)  # halfway from 5 to 3
    assert curve.loss_at_wall(25.0) == pytest.approx(2.25)  # three quarters from 3 to 2
    assert curve.loss_at_wall(10.0) == pytest.approx(3.0)
    assert curve.loss_at_wall(99.0) == 2.0  # the run alone ended sooner: its last loss
    assert curve.loss_at_wall(-1.0) == 5.0


@pytest.mark.skipif(not hasattr(slowlink, "Session"), reason="slowlink.Session has not landed yet")
def test_a_short_real_demo_commits_rounds_prints_the_summary_and_writes_the_png(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "slowlink.cli.main", "demo", "--model", "tiny", "--workers", "2"]
    command += ["--steps", "30", "--sync-every", "10", "--fragments", "2", "--out", str(out)]
    env = {**os.environ, "COLUMNS": "120"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "slowlink demo: results" in done.stdout
    assert "held-out loss at" in done.stdout and "rounds committed" in done.stdout

    png = (out / "loss.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000

    summary = json.loads((out / "summary.json").read_text())
    distributed, alone = summary["distributed"], summary["alone"]
    assert sorted(distributed["stats"]) == ["node-0", "node-1"]
    # H=10, P=2 over 30 steps: fragment 0 syncs at 10, 20, 30 and fragment 1 at 15, 25, then flushes.
    assert all(stats["commits_applied"] >= 3 for stats in distributed["stats"].values())
    assert all(
        stats["bytes_sent"] > 0 and stats["bytes_received"] > 0 for stats in distributed["stats"].values()
    )
    # The "nothing lost" counters reach the summary. (The tiny model trains 30 steps faster than rounds
    # commit, so a few steps after the last in-flight round may go unmerged; they are counted, not hidden.)
    assert all(stats["steps_dropped"] >= 0 for stats in distributed["stats"].values())
    assert sum(stats["contributions_rejected"] for stats in distributed["stats"].values()) == 0
    assert "steps dropped" in done.stdout and "contributions rejected" in done.stdout
    # Both learned: from near ln 256 = 5.55 nats at the start to at least a nat lower (about 3.4 and 3.0 on
    # Python 3.11); the committed model is a trained one, not the initial model.
    initial = distributed["curve"]["loss"][0]
    assert initial > 5.2 and alone["curve"]["loss"][0] == pytest.approx(initial, abs=1e-6)
    assert distributed["final_loss"] < initial - 1.0 and alone["final_loss"] < initial - 1.0
    assert distributed["samples"] == alone["samples"] == 2 * 30 * DemoConfig().batch_size
    assert math.isfinite(summary["alone_loss_at_equal_wall"])
