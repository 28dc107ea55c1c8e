"""The `status` and `report` commands: their options are pinned (STYLE.md rule 13), and `--watch --json`
is a stream of one JSON object a line until Ctrl-C."""

import json
import re
import time

import pytest

import slowlink as sl
from slowlink.cli.main import main
from tests.session.nodes import run_nodes

OPTIONS = {
    "status": {"--endpoint-url", "--region", "--json", "--watch", "--recent", "--observe", "--lease-seconds"},
    "report": {"--endpoint-url", "--region", "--out", "--events", "--title"},
}


@pytest.mark.parametrize("command", sorted(OPTIONS))
def test_help_lists_exactly_these_options(command, capsys):
    with pytest.raises(SystemExit) as exit:
        main([command, "--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    assert set(re.findall(r"--[a-z][a-z-]*", text)) == OPTIONS[command] | {"--help"}
    assert "MAILBOX" in text and "s3://bucket/prefix" in text


def test_watch_json_prints_one_status_a_line_until_interrupted(tmp_path, capsys, monkeypatch):
    path = tmp_path / "run"
    run_nodes(1, sl.DiLoCo(sync_every=2, overlap_steps=0), sl.DirMailbox(path), 6)
    naps = []

    def nap(seconds):
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", nap)
    assert main(["status", str(path), "--watch", "0.5", "--json"]) == 130
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and naps == [0.5, 0.5, 0.5]
    assert all(json.loads(line)["head"] == [3] for line in lines)


def test_an_endpoint_url_is_only_for_s3_mailboxes(tmp_path, capsys):
    assert main(["status", str(tmp_path), "--endpoint-url", "http://127.0.0.1:9"]) == 1
    assert "--endpoint-url is for s3:// mailboxes" in capsys.readouterr().err
