"""protocol/summary.py's update_summary: hand-made commit records in, totals out."""

from slowlink.protocol.summary import MAX_TIMELINE, empty_summary, update_summary


def commit(fragment, round_, merger, contributors, rejected=()):
    return {
        "fragment": fragment, "round": round_, "merger": merger,
        "contributors": [{"node": n, "samples": s, "steps": t, "weight": s, "blob": "x", "final": False}
                         for n, s, t in contributors],
        "rejected": [{"node": n, "reason": r} for n, r in rejected],
    }  # fmt: skip


def test_two_commits_add_up_per_node_and_per_fragment_and_a_new_merger_is_a_leader_change():
    summary = empty_summary(2)
    summary = update_summary(summary, commit(0, 1, "a", [("a", 8, 2), ("b", 4, 2)]), time=10.0,
                             payload_bytes={"a": 100, "b": 100}, commit_bytes=300)  # fmt: skip
    summary = update_summary(summary, commit(1, 1, "b", [("a", 16, 4)], rejected=[("b", "NaN in its Δ")]),
                             time=12.0, payload_bytes={"a": 50})  # fmt: skip
    a, b = summary["nodes"]["a"], summary["nodes"]["b"]
    assert (a["contributions"], a["samples"], a["steps"], a["payload_bytes"]) == (2, [8, 16], [2, 4], 150)
    assert (b["contributions"], b["rejected"], b["last_rejection"], b["merged"]) == (1, 1, "NaN in its Δ", 1)
    assert summary["fragments"][0] | {} == {"round": 1, "commits": 1, "contributions": 2, "rejected": 0,
                                           "samples": 12, "steps": 4, "payload_bytes": 200, "commit_bytes": 300}  # fmt: skip
    assert summary["fragments"][1]["rejected"] == 1
    assert summary["leader_changes"] == [{"time": 12.0, "fragment": 1, "round": 1, "from": "a", "to": "b"}]
    assert summary["timeline"] == [[10.0, 0, 1, [0, 1], 0, 0], [12.0, 1, 1, [0], 1, 1]]
    assert summary["updated"] == 12.0


def test_a_commit_already_summarized_changes_nothing_and_the_input_is_never_modified():
    first = update_summary(empty_summary(1), commit(0, 1, "a", [("a", 1, 1)]), time=1.0)
    snapshot = repr(first)
    assert update_summary(first, commit(0, 1, "a", [("a", 1, 1)]), time=2.0) is first
    update_summary(first, commit(0, 2, "a", [("a", 1, 1)]), time=2.0)
    assert repr(first) == snapshot


def test_a_payload_collected_before_it_was_measured_counts_as_the_nodes_mean_so_far():
    summary = update_summary(
        empty_summary(1), commit(0, 1, "a", [("a", 1, 1)]), time=1.0, payload_bytes={"a": 90}
    )
    summary = update_summary(summary, commit(0, 2, "a", [("a", 1, 1)]), time=2.0)
    assert (
        summary["nodes"]["a"]["payload_bytes"] == 180
        and summary["nodes"]["a"]["payload_bytes_estimated"] == 1
    )


def test_the_timeline_stays_bounded_by_thinning_its_older_half():
    summary = empty_summary(1)
    for round_ in range(1, 3 * MAX_TIMELINE):
        summary = update_summary(summary, commit(0, round_, "a", [("a", 1, 1)]), time=float(round_))
    rounds = [entry[2] for entry in summary["timeline"]]
    assert len(rounds) <= MAX_TIMELINE and rounds[-1] == 3 * MAX_TIMELINE - 1 and rounds[0] == 1
    assert rounds == sorted(rounds) and summary["fragments"][0]["commits"] == 3 * MAX_TIMELINE - 1
