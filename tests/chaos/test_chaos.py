"""The chaos benchmark in small form: four learner processes over a faulty DirMailbox and a faulty S3 store,
the leader SIGKILLed and restarted under its node id, a late joiner; the benchmark's checks must all hold.
The code is benchmarks/chaos.py's; `python benchmarks/chaos.py` runs the full set of seeded schedules."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for path in (str(ROOT / "benchmarks"), str(ROOT)):  # the benchmark's modules, and tests/s3server.py
    if path not in sys.path:
        sys.path.insert(0, path)

import chaos  # noqa: E402
from chaos_checks import LifeRecord, Outcome, check_accounting, check_fates, known_bug, match_contributors  # noqa: E402
from chaos_schedule import Action, Schedule, make_schedule  # noqa: E402

from tests.s3server import s3_endpoint  # noqa: E402, F401

NODES = ("node-0", "node-1", "node-2", "node-3")
# Three nodes start; node-3 joins 10% of the way through their steps; at 25% the leader is killed, and
# restarted under the same node id a second later.
SCHEDULE = Schedule(
    seed=7,
    nodes=NODES,
    first=NODES[:3],
    actions=(Action("join", 0.1, node="node-3"), Action("kill_leader", 0.25, restart_after=1.0)),
)
STEPS = 150


@pytest.mark.timeout(600)
@pytest.mark.parametrize("store", ["dir", "s3"])
def test_a_run_survives_its_leader_killed_and_restarted_while_requests_fail(store, tmp_path, request):
    endpoint = request.getfixturevalue("s3_endpoint") if store == "s3" else None
    outcome = chaos.run_schedule(SCHEDULE, store, tmp_path, steps=STEPS, endpoint=endpoint)
    assert (outcome.kills, outcome.leader_kills, outcome.restarts, outcome.joins) == (1, 1, 1, 1)
    assert sum(outcome.faults_finished.values()) > 0  # the faults were really injected
    assert outcome.rounds >= 4
    assert outcome.loss_final < outcome.loss_initial - 0.5, (outcome.loss_initial, outcome.loss_final)
    # Every check of the benchmark: exits, unbroken commits, contributors matched to what their nodes
    # sent and none twice, every trained step accounted for, a finite model that learned. A failure that
    # a known bug in src/slowlink explains (chaos_checks.KNOWN_BUGS) is reported as an expected failure.
    unknown = [failure for failure in outcome.failures if known_bug(failure) is None]
    assert unknown == [], "\n".join(unknown)
    if outcome.failures:
        pytest.xfail("known bugs in src/slowlink: " + " | ".join(outcome.failures))


def test_the_checks_flag_a_commit_counting_a_contribution_its_node_never_sent():
    # node-0 logged one contribution, to fragment 0 round 1 with 20 steps. Commit 0/1 counts it; commit
    # 0/2 counts node-0 again with the same steps (a contribution used twice); commit 1/1 counts node-1,
    # which sent nothing and was never killed.
    sent = {"kind": "contribution_sent", "data": {"fragment": 0, "round": 1, "step": 20, "steps": 20}}
    lives = [
        LifeRecord("node-0", 0, False, 0, 9.0, [sent], None, ""),
        LifeRecord("node-1", 0, False, 0, 9.0, [], None, ""),
    ]
    commits = {
        (0, 1): {"contributors": [{"node": "node-0", "steps": 20}]},
        (0, 2): {"contributors": [{"node": "node-0", "steps": 20}]},
        (1, 1): {"contributors": [{"node": "node-1", "steps": 20}]},
    }
    outcome = Outcome()
    merged, unpaired = match_contributors(commits, lives, outcome)
    assert merged == {(0, 0): [sent["data"]]} and unpaired == [[], []]
    assert [failure.split(" counts ")[0] for failure in outcome.failures] == [
        "contributors: commit 0/2",
        "contributors: commit 1/1",
    ]


def test_the_checks_pair_two_lives_contributing_to_one_round_by_their_payload():
    # node-0 sent 20 steps to fragment 0 round 1, was killed, and its restarted life sent 20 steps to the
    # same round under the same record key. The commit names the second life's payload: the first life's
    # contribution is the one left unpaired, though it has the same steps.
    first = {
        "kind": "contribution_sent",
        "data": {"fragment": 0, "round": 1, "step": 20, "steps": 20, "blob": "aa"},
    }
    second = {
        "kind": "contribution_sent",
        "data": {"fragment": 0, "round": 1, "step": 20, "steps": 20, "blob": "bb"},
    }
    lives = [
        LifeRecord("node-0", 0, True, -9, 5.0, [first], None, ""),
        LifeRecord("node-0", 1, False, 0, 9.0, [second], None, ""),
    ]
    outcome = Outcome()
    commits = {(0, 1): {"contributors": [{"node": "node-0", "steps": 20, "blob": "bb"}]}}
    merged, unpaired = match_contributors(commits, lives, outcome)
    assert merged == {(1, 0): [second["data"]]} and unpaired == [[first["data"]], []]
    assert outcome.failures == [] and outcome.notes == ["commit 0/1: 2 lives of node-0 contributed"]


def test_the_checks_count_a_record_that_landed_with_its_answer_lost_as_merged_for_its_node():
    # node-0's PUT of its contribution to fragment 0 round 1 landed but failed, so it never logged sending it;
    # commit 0/1 counts its 20 steps. They are the node's merged steps, unless it was told they missed.
    progress = {"kind": "progress", "step": 20}
    lost = {"kind": "mailbox_error", "message": "injected failure (Faulty, seed 1): PUT rounds/0000/0000000001/"
            "node-0.delta failed after the store applied it; its answer was lost"}  # fmt: skip
    late = {"kind": "contribution_late", "data": {"fragment": 0, "round": 1, "steps": 20}}
    commits = {(0, 1): {"contributors": [{"node": "node-0", "steps": 20}]}}
    for events, failures in (([progress, lost], 0), ([progress, lost, late], 1)):
        lives = [LifeRecord("node-0", 0, False, 0, 9.0, events, None, "")]
        outcome = Outcome()
        merged, _ = match_contributors(commits, lives, outcome)
        check_fates(lives, merged, outcome)
        assert merged == {(0, 0): [{"fragment": 0, "round": 1, "step": 20, "steps": 20}]}
        assert len(outcome.failures) == failures, outcome.failures


def test_the_checks_flag_a_merged_contribution_its_node_was_told_had_missed_the_round():
    # node-0's 20 steps to fragment 0 round 1 are in commit 0/1, but its log says the round was committed
    # without them (contribution_late): it carried those steps into its next contribution.
    sent = {"kind": "contribution_sent", "data": {"fragment": 0, "round": 1, "step": 20, "steps": 20}}
    late = {"kind": "contribution_late", "data": {"fragment": 0, "round": 1, "steps": 20}}
    lives = [LifeRecord("node-0", 0, False, 0, 9.0, [sent, late], None, "")]
    outcome = Outcome()
    merged, _ = match_contributors(
        {(0, 1): {"contributors": [{"node": "node-0", "steps": 20}]}}, lives, outcome
    )
    check_fates(lives, merged, outcome)
    assert len(outcome.failures) == 1 and outcome.failures[0].startswith(
        "fates: node-0 life 0's contribution to 0/1"
    )


def test_the_checks_flag_trained_steps_that_are_neither_merged_nor_reported():
    # node-0 trained 40 steps of one fragment: 20 are in commit 0/1, 10 it reports unmerged, 10 unconfirmed
    # (in its contribution to round 2, which a commit may merge after it left). All 40 are accounted for.
    # Had it reported none unconfirmed, 10 steps would be lost without a word.
    sent = [
        {"fragment": 0, "round": 1, "step": 20, "steps": 20},
        {"fragment": 0, "round": 2, "step": 30, "steps": 10},
    ]
    events = [{"kind": "contribution_sent", "data": data} for data in sent]
    events.append({"kind": "steps_unconfirmed", "data": {"steps": 10, "rounds": [[0, 2]]}})
    commits = {(0, 1): {"contributors": [{"node": "node-0", "steps": 20}]}}
    for unconfirmed, failures in ((10, 0), (0, 1)):
        stats = {"step": 40, "steps_dropped": 10, "steps_unconfirmed": unconfirmed}
        lives = [LifeRecord("node-0", 0, False, 0, 9.0, events, {"stats": stats}, "")]
        outcome = Outcome()
        merged, unpaired = match_contributors(commits, lives, outcome)
        check_accounting(lives, commits, merged, unpaired, 1, outcome)
        assert len(outcome.failures) == failures, outcome.failures


def test_a_schedule_is_a_function_of_its_seed_and_always_kills_the_leader_and_restarts():
    for seed in range(50):
        schedule = make_schedule(seed)
        assert schedule == make_schedule(seed)
        kinds = [action.kind for action in schedule.actions]
        assert "kill_leader" in kinds and 2 <= kinds.count("kill") + kinds.count("kill_leader") <= 3
        assert any(action.restart_after is not None for action in schedule.actions)
        late = {action.node for action in schedule.actions if action.kind == "join"}
        assert late and late.isdisjoint(schedule.first) and late | set(schedule.first) == set(NODES)
    assert make_schedule(0) != make_schedule(1)
