"""`slowlink status`: what it shows of a finished run and of a run in progress matches what the nodes
themselves reported, it never writes, and it costs the same requests after few rounds and after many."""

import json

import pytest

import slowlink as sl
from slowlink.cli.main import main
from slowlink.ops.status import StatusReader, find_stalls, read_status
from slowlink.protocol.housekeeping import Housekeeping
from slowlink.protocol.run import read_commit
from slowlink.protocol.summary import read_summary, record_commit
from tests.ops.mailboxes import Recording
from tests.ops.runs import EventLog, held_versions, paused_run
from tests.s3server import fresh_s3_mailbox
from tests.session.nodes import run_nodes

ALGORITHM = sl.DiLoCo(sync_every=4, fragments=2, quorum_size=2, flush_on_close=True)


def status_json(capsys, *argv: str) -> dict:
    observe = [] if "--observe" in argv else ["--observe", "0"]  # a finished run has no lease to watch
    assert main(["status", *argv, "--json", *observe]) == 0
    return json.loads(capsys.readouterr().out)


def test_status_of_a_finished_directory_run_shows_every_departed_node_with_the_totals_they_reported(
    tmp_path, capsys
):
    path = tmp_path / "run"
    mailbox = sl.DirMailbox(path)
    log = EventLog()
    # close_timeout: the last round waits for a node that has left no longer than a fresh look at the leases
    _, stats = run_nodes(2, ALGORITHM, mailbox, 20, on_event=log, close_timeout=10)

    status = status_json(capsys, str(path))
    # The node that left last holds the newest commits: it may have merged rounds alone at the end.
    assert status["summary"] and status["head"] == [
        max(v) for v in zip(*(mine.versions for mine in stats), strict=True)
    ]
    nodes = {node["node"]: node for node in status["nodes"]}
    assert sorted(nodes) == ["node-0", "node-1"]  # the leases are gone; the commits remember them
    sent = log.payload_bytes()
    for mine in stats:
        node = nodes[mine.node]
        assert node["state"] == "departed" and node["step"] is None
        # Every contribution was merged (quorum of both, flushed on close): the run's totals are the node's.
        assert mine.contributions_late == mine.contributions_rejected == mine.steps_dropped == 0
        assert node["contributions"] == mine.contributions_sent
        assert node["steps_merged"] == mine.step == 20
        assert node["samples_merged"] == mine.samples == 80
        assert node["payload_bytes"] == sent[mine.node]  # measured in the store, reported by the node
        assert node["rounds_merged"] == mine.rounds_merged
    assert status["bytes"] == {"contributions": sum(sent.values()), "commits": status["bytes"]["commits"],
                               "estimated": False}  # fmt: skip
    assert status["bytes"]["commits"] > 0
    for fragment in status["fragments"]:
        assert {c["node"] for c in fragment["contributors"]} <= {"node-0", "node-1"}
        assert fragment["rejected"] == [] and fragment["merger"] in nodes
    assert sum(f["contributions"] for f in status["fragments"]) == sum(m.contributions_sent for m in stats)
    assert status["stalls"] == [] or all(not stall["ongoing"] for stall in status["stalls"])

    assert main(["status", str(path), "--observe", "0"]) == 0
    text = capsys.readouterr().out
    assert "departed" in text and "node-0" in text and "node-1" in text
    assert "…" not in text  # piped output is not cut
    for mine in stats:
        assert f"{mine.contributions_sent} " in text


def test_status_reads_only_and_costs_the_same_requests_after_3_rounds_and_after_30():
    costs = {}
    for rounds in (3, 30):
        for summarized in (True, False):
            inner = sl.MemoryMailbox()
            algorithm = sl.DiLoCo(sync_every=2, overlap_steps=0, quorum_size=2)
            _, stats = run_nodes(2, algorithm, inner, 2 * rounds)
            if not summarized:  # a run from before summaries, or whose summary.json was lost
                inner.delete(["summary.json"])
            assert max(mine.versions[0] for mine in stats) == rounds
            recording = Recording(inner)
            status = read_status(recording)
            assert recording.writes == []
            assert status.summary is summarized and len(status.nodes) == 2
            costs[rounds, summarized] = dict(recording.requests)
    assert costs[3, True] == costs[30, True]
    assert costs[3, False] == costs[30, False]
    # run, head, leader, summary, then the newest commit probed past and the 3 newest read; a LIST of leases.
    assert costs[30, True] == {"GET": 4 + 1 + 3, "LIST": 1}
    assert costs[30, False] == {"GET": 4 + 1 + 3, "LIST": 2}  # and one of rounds/, to estimate bytes


def test_status_of_a_run_in_progress_over_s3_matches_each_nodes_own_figures(s3_endpoint, capsys):
    algorithm = sl.DiLoCo(sync_every=4, fragments=2)
    with fresh_s3_mailbox(s3_endpoint) as mailbox:
        target = f"s3://{mailbox.bucket}/{mailbox.prefix}"
        with paused_run(2, algorithm, mailbox, steps=16, pause_at=12, lease_seconds=4) as (sessions, _):
            mailbox.delete(["summary.json"])  # the figures from the leases and commits alone
            # A one-off look, without watching: each lease says when it was written (the store's time).
            status = status_json(capsys, target, "--endpoint-url", s3_endpoint.url, "--observe", "0")
            nodes = {node["node"]: node for node in status["nodes"]}
            assert sorted(nodes) == ["node-0", "node-1"]
            for session in sessions:
                node, mine = nodes[session.node_id], session.stats
                assert node["state"] == "live" and node["lease_age"] < 4  # beaten a quarter lease apart
                assert (node["step"], node["samples"]) == (mine.step, mine.samples) == (12, 48)
                assert node["versions"] == held_versions(session) == status["head"]
                assert node["lag"] == 0 and node["steps_per_second"] > 0
                assert node["is_leader"] == session.courier.leadership.is_leader
            assert status["leader"] in nodes and not status["summary"] and status["bytes"]["estimated"]
            for fragment in status["fragments"]:
                assert fragment["round"] >= 1 and fragment["merger"] == status["leader"]
                assert {c["node"] for c in fragment["contributors"]} <= set(nodes)
            text_status = main(["status", target, "--endpoint-url", s3_endpoint.url])
            text = capsys.readouterr().out
            assert text_status == 0 and text.count("live") >= 2 and "(leader)" in text


def test_a_stall_is_a_gap_far_longer_than_the_usual_one_and_an_ongoing_one_counts_from_now():
    times = [0.0, 1.0, 2.0, 3.0, 30.0, 31.0]  # median gap 1 s; 27 s is a stall
    assert find_stalls(times) == [{"start": 3.0, "seconds": 27.0, "ongoing": False}]
    assert find_stalls(times, now=32.0) == [{"start": 3.0, "seconds": 27.0, "ongoing": False}]
    assert find_stalls(times, now=60.0)[-1] == {"start": 31.0, "seconds": 29.0, "ongoing": True}
    assert find_stalls([0.0, 1.0]) == []


def test_a_watching_reader_tells_a_silent_lease_from_a_live_one_on_its_own_clock():
    mailbox = sl.MemoryMailbox()
    _, _ = run_nodes(1, sl.DiLoCo(sync_every=2), mailbox, 4)
    now = [100.0]
    reader = StatusReader(mailbox, lease_seconds=10, clock=lambda: now[0])
    # A node that crashed leaves its lease behind; a live one keeps rewriting it.
    mailbox.put("nodes/ghost.json", json.dumps({"node": "ghost", "beat": 1, "step": 7, "samples": 7,
                                                "step_seconds": 0.5}).encode())  # fmt: skip
    mailbox.put("nodes/alive.json", json.dumps({"node": "alive", "beat": 1, "step": 1, "samples": 1,
                                                "step_seconds": 0.5}).encode())  # fmt: skip
    first = {node.node: node for node in reader.read().nodes}
    assert first["ghost"].state == first["alive"].state == "quiet" and first["ghost"].lease_age is None
    now[0] += 11
    mailbox.put("nodes/alive.json", json.dumps({"node": "alive", "beat": 2, "step": 9, "samples": 9,
                                                "step_seconds": 0.5}).encode())  # fmt: skip
    second = {node.node: node for node in reader.read().nodes}
    assert second["ghost"].state == "silent" and second["alive"].state == "live"
    assert second["alive"].lease_age == 0 and second["alive"].step == 9
    assert second["node-0"].state == "departed"


def test_a_one_off_look_tells_a_silent_lease_from_a_live_one_by_the_time_each_was_written():
    # Leases are beaten only a quarter lease apart: a look cannot wait to see one change. Each says when it
    # was written, on the store's clock; one not rewritten for a lease is silent.
    mailbox = sl.MemoryMailbox()
    _, _ = run_nodes(1, sl.DiLoCo(sync_every=2), mailbox, 4)
    for name, written in (("ghost", mailbox.clock() - 11), ("alive", mailbox.clock() - 3)):
        mailbox.put(f"nodes/{name}.json", json.dumps({"node": name, "beat": 1, "step": 7, "samples": 7,
                                                      "step_seconds": 0.5, "written": written}).encode())  # fmt: skip
    nodes = {node.node: node for node in StatusReader(mailbox, lease_seconds=10).read().nodes}
    assert nodes["ghost"].state == "silent" and 11 <= nodes["ghost"].lease_age < 12
    assert nodes["alive"].state == "live" and 3 <= nodes["alive"].lease_age < 4
    assert nodes["node-0"].state == "departed"


def test_status_of_a_folder_without_a_run_says_what_to_pass(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 1
    assert "holds no run" in capsys.readouterr().err


@pytest.mark.parametrize("fragments", [1, 3])
def test_the_summary_counts_each_commit_once_however_often_the_hook_runs(fragments):
    inner = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=3, fragments=fragments, quorum_size=2, flush_on_close=True)
    _, stats = run_nodes(2, algorithm, inner, 12)
    summary, _ = read_summary(inner, fragments)
    newest = [max(v) for v in zip(*(mine.versions for mine in stats), strict=True)]
    for q in range(fragments):  # the hook again for every commit, as a retrying merger would
        for round_ in range(1, newest[q] + 1):
            record_commit(inner, fragments, read_commit(inner, q, round_))
    again, _ = read_summary(inner, fragments)
    assert again == summary
    assert [totals["round"] for totals in summary["fragments"]] == newest
    assert sum(totals["commits"] for totals in summary["fragments"]) == sum(newest)
    assert sum(node["contributions"] for node in summary["nodes"].values()) == sum(
        mine.contributions_sent for mine in stats
    )


def test_a_summary_that_missed_commits_catches_up_from_their_records_on_the_next_one():
    inner = sl.MemoryMailbox()
    _, stats = run_nodes(2, sl.DiLoCo(sync_every=2, overlap_steps=0, quorum_size=2), inner, 10)
    assert stats[0].versions == (5,)
    record_commit(inner, 1, read_commit(inner, 0, 1))
    # The merger died after committing rounds 2 to 4 and before summarizing them; round 5's call reads them.
    record_commit(inner, 1, read_commit(inner, 0, 5))
    summary, _ = read_summary(inner, 1)
    assert summary["fragments"][0]["round"] == 5 and summary["fragments"][0]["commits"] == 5
    assert [entry[2] for entry in summary["timeline"]] == [1, 2, 3, 4, 5]
    assert {name: node["contributions"] for name, node in summary["nodes"].items()} == {
        "node-0": 5,
        "node-1": 5,
    }
    assert {name: node["steps"] for name, node in summary["nodes"].items()} == {
        "node-0": [10],
        "node-1": [10],
    }
    assert summary["commits_unsummarized"] == 0


def test_a_merger_leaving_folds_the_commits_of_every_fragment_an_earlier_merger_left_out():
    inner = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=2, fragments=2, overlap_steps=0, quorum_size=2)
    _, stats = run_nodes(2, algorithm, inner, 12)
    newest = [max(v) for v in zip(*(mine.versions for mine in stats), strict=True)]
    assert min(newest) >= 2
    inner.delete(["summary.json"])
    # An earlier merger lost the lead after committing fragment 1's newest round and never folded it; the
    # merger after it committed only fragment 0's rounds, so no fold of its own reaches fragment 1.
    for q in range(2):
        for round_ in range(1, newest[q] + (q == 0)):
            record_commit(inner, 2, read_commit(inner, q, round_))
    summary, _ = read_summary(inner, 2)
    assert [totals["round"] for totals in summary["fragments"]] == [newest[0], newest[1] - 1]
    Housekeeping(inner, 2, "node-0", lambda event: None, lambda: 0.0).tidy(head=newest)  # the leave's tidy
    summary, _ = read_summary(inner, 2)
    assert [totals["round"] for totals in summary["fragments"]] == newest
    assert sum(node["contributions"] for node in summary["nodes"].values()) == sum(
        mine.contributions_sent for mine in stats
    )


def test_in_a_signed_run_the_summary_is_signed_by_the_merger_and_status_reads_it_without_the_key():
    from slowlink.protocol.trust import RunKey, Signed

    inner, key = sl.MemoryMailbox(), "k" * 32
    _, stats = run_nodes(2, sl.DiLoCo(sync_every=2, overlap_steps=0, quorum_size=2), inner, 6, run_key=key)
    merger = Signed(inner, RunKey(key))  # the mailbox as the merger sees it
    merger.get("run.json")  # which binds it to the run
    inner.delete(["summary.json"])  # written afresh below
    for round_ in range(1, 4):
        record_commit(merger, 1, read_commit(merger, 0, round_))
    assert b'"signature":"' in inner.get("summary.json").data
    assert read_summary(merger, 1)[0]["fragments"][0]["commits"] == 3  # its signature checks
    status = read_status(inner)
    assert status.signed and status.summary
    assert {n.node: n.contributions for n in status.nodes} == {"node-0": 3, "node-1": 3}
