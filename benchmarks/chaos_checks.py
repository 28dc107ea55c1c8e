"""After a chaos schedule: read the store directly and the learners' logs, check the run, and measure it.

Checks: every life not killed exited 0 after its steps; each fragment's commits run 1..n unbroken, and
align() loads the last; each contributor of a commit had logged sending that contribution, none is
counted twice, and no node was told a merged contribution missed its round; every life that finished
accounts for each step it trained; the committed model is finite and its held-out loss is below the
initial model's. Figures: kills, faults, rounds, stalls, work lost.
"""

import json
import math
from collections import Counter
from dataclasses import dataclass, field

import torch

import slowlink as sl
from slowlink.demo.corpus import heldout_windows, load_corpus
from slowlink.demo.model import build_model, evaluate
from slowlink.protocol import keys
from slowlink.protocol.run import read_commit, read_head, read_run

# What Faulty says when a write landed but its answer was lost.
LOST_ANSWER = "failed after the store applied it"

# Failures caused by bugs known in src/slowlink, by a phrase of their message. Delete an entry once its bug
# is fixed: the benchmark and tests/chaos then fail on it like on any other failure.
KNOWN_BUGS: dict[str, str] = {}  # none at present: the bugs this benchmark found are fixed in src


def known_bug(failure: str) -> str | None:
    return next((bug for phrase, bug in KNOWN_BUGS.items() if phrase in failure), None)


@dataclass
class LifeRecord:
    """What one life left behind: its log, and its result file if it finished."""

    node: str
    life: int
    killed: bool
    returncode: int | None
    ended: float | None
    events: list[dict]
    result: dict | None
    stderr: str

    @classmethod
    def read(cls, life) -> "LifeRecord":
        text = life.log.read_text() if life.log.exists() else ""
        # A SIGKILL can cut the last line short: keep the whole lines only.
        events = []
        for line in text.splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        result = json.loads(life.out.read_text()) if life.out.exists() else None
        stderr = life.stderr.read_text() if life.stderr.exists() else ""
        return cls(life.node, life.life, life.killed, life.returncode, life.ended, events, result, stderr)

    @property
    def name(self) -> str:
        return f"{self.node} life {self.life}"

    def sent(self) -> list[dict]:
        return [event["data"] for event in self.events if event["kind"] == "contribution_sent"]

    def last_step(self) -> int:
        steps = [e["step"] for e in self.events if e["kind"] == "progress"] + [d["step"] for d in self.sent()]
        return max(steps, default=0)

    def last_progress(self) -> dict:
        """Faults and requests as last reported: at exit, or (killed) at its last progress line."""
        if self.result is not None:
            return {"faults": self.result["faults"], "requests": sum(self.result["requests"].values())}
        progress = [e for e in self.events if e["kind"] == "progress"]
        return progress[-1] if progress else {"faults": {}, "requests": 0}

    def unconfirmed_rounds(self) -> set[tuple[int, int]]:
        """(fragment, round) of the contributions still awaiting their commit when this life left."""
        return {
            tuple(pair)
            for e in self.events
            if e["kind"] == "steps_unconfirmed"
            for pair in e["data"]["rounds"]
        }

    def errors(self) -> list[tuple[float, str]]:
        return [
            (e["t"], e["message"]) for e in self.events if e["kind"] in ("mailbox_error", "upload_failed")
        ]


@dataclass
class Outcome:
    """One schedule's verdict and figures; times are seconds since the schedule started."""

    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kills: int = 0
    leader_kills: int = 0
    restarts: int = 0
    joins: int = 0
    faults_finished: Counter = field(default_factory=Counter)  # reported by the lives that exited
    faults_killed: Counter = field(default_factory=Counter)  # at least: killed lives' last progress lines
    requests: int = 0
    rounds: int = 0
    stall: float = 0.0
    stall_cause: str = ""
    takeovers: list[float] = field(default_factory=list)  # seconds from each leader kill to a new term
    lost_finished: int = 0  # fragment-steps of lives that exited: unmerged, or unconfirmed and never merged
    lost_killed: int = 0  # fragment-steps of killed lives after their last merged contribution
    loss_initial: float = math.nan
    loss_final: float = math.nan
    seconds: float = 0.0

    def fail(self, check: str, message: str) -> None:
        self.failures.append(f"{check}: {message}")

    @property
    def survived(self) -> bool:
        """The run came through its kills: every life not killed finished its steps, and the committed model
        is finite and learned (the bookkeeping checks aside)."""
        return not any(failure.startswith(("exits:", "model:")) for failure in self.failures)


def check(played, mailbox, *, fragments: int, steps: int) -> Outcome:
    """Judge a played schedule from the store (`mailbox`, without faults) and the lives' logs."""
    outcome = Outcome(seconds=played.seconds)
    lives = [LifeRecord.read(life) for life in played.lives]
    count_actions(played, outcome)
    check_exits(played, lives, steps, outcome)
    commits = read_commits(mailbox, fragments, outcome)
    merged, unused = match_contributors(commits, lives, outcome)
    check_fates(lives, merged, outcome)
    check_accounting(lives, commits, merged, unused, fragments, outcome)
    check_model(mailbox, commits, outcome)
    measure(played, lives, commits, merged, fragments, outcome)
    return outcome


def count_actions(played, outcome: Outcome) -> None:
    kinds = Counter(kind for _, kind, _ in played.done)
    outcome.kills = kinds["kill"] + kinds["kill_leader"]
    outcome.leader_kills = kinds["kill_leader"]
    outcome.restarts = kinds["restart"]
    outcome.joins = sum(1 for action in played.schedule.actions if action.kind == "join") - sum(
        1 for action in played.unfired if action.kind == "join"
    )
    for action in played.unfired:
        outcome.notes.append(f"{action.kind} at t+{action.at:.1f}s did not fire: the run ended first")


def check_exits(played, lives: list[LifeRecord], steps: int, outcome: Outcome) -> None:
    if played.timed_out:
        outcome.fail("exits", f"the run did not finish within its deadline ({played.seconds:.0f} s)")
    for life in lives:
        if life.killed:
            continue
        if life.returncode != 0 or life.result is None:
            tail = " | ".join(life.stderr.strip().splitlines()[-3:])
            outcome.fail("exits", f"{life.name} exited with code {life.returncode}: {tail}")
        elif life.result["stats"]["step"] != steps:
            outcome.fail(
                "exits", f"{life.name} stopped after {life.result['stats']['step']} of {steps} steps"
            )


def read_commits(mailbox, fragments: int, outcome: Outcome) -> dict[tuple[int, int], dict]:
    """Every commit record; each fragment's rounds must be an unbroken 1..n."""
    versions, _ = read_head(mailbox, fragments)
    found: dict[int, list[int]] = {fragment: [] for fragment in range(fragments)}
    for listing in mailbox.list("commits/"):
        fragment, name = listing.key.removeprefix("commits/").split("/")
        found[int(fragment)].append(int(name.removesuffix(".json")))
    commits = {}
    for fragment, rounds in found.items():
        rounds.sort()
        if rounds != list(range(1, len(rounds) + 1)):
            outcome.fail("commits", f"fragment {fragment}: commits {rounds} are not an unbroken 1..n")
        elif len(rounds) != versions[fragment]:  # a hint only: readers probe the next commit by key
            outcome.notes.append(f"fragment {fragment}: the run ended with head.json naming commit "
                                 f"{versions[fragment]} of {len(rounds)}")  # fmt: skip
        for round_ in rounds:
            commits[fragment, round_] = read_commit(mailbox, fragment, round_)
    outcome.rounds = len(commits)
    return commits


def match_contributors(commits: dict, lives: list[LifeRecord], outcome: Outcome) -> tuple[dict, list]:
    """Pair each commit's contributors with a logged contribution_sent of that node for that fragment and
    round, with the same payload sha (or steps); each logged contribution pairs once. Returns the merged
    contributions by (life index, fragment), as their logged data, and each life's logged contributions
    left unpaired."""
    unused = [list(life.sent()) for life in lives]
    merged: dict[tuple[int, int], list[dict]] = {}
    for (fragment, round_), record in sorted(commits.items()):
        for contributor in record["contributors"]:
            node = contributor["node"]
            candidates = [(i, sent) for i, life in enumerate(lives) if life.node == node for sent in unused[i]
                          if (sent["fragment"], sent["round"]) == (fragment, round_)]  # fmt: skip
            if len({i for i, _ in candidates}) > 1:
                # Lives of one node contributing to one round share a record key; the payload sha in the
                # commit tells them apart, and the accounting check finds any steps this loses.
                outcome.notes.append(
                    f"commit {fragment}/{round_}: {len(candidates)} lives of {node} contributed"
                )
            match = next(((i, sent) for i, sent in candidates if same_contribution(sent, contributor)), None)
            if match is not None:
                unused[match[0]].remove(match[1])
                merged.setdefault((match[0], fragment), []).append(match[1])
                continue
            lost = lost_answer(lives, node, fragment, round_)
            if lost is not None:
                # Its record landed, its answer lost: the node awaited this commit all the same (check_fates
                # says whether it was told so), but never logged the contribution as sent.
                index, step = lost
                unlogged = {
                    "fragment": fragment,
                    "round": round_,
                    "step": step,
                    "steps": contributor["steps"],
                }
                merged.setdefault((index, fragment), []).append(unlogged)
                outcome.notes.append(
                    f"commit {fragment}/{round_}: {lives[index].name}'s record landed, its answer lost"
                )
            elif killed_while_sending(lives, node, fragment, round_):
                outcome.notes.append(
                    f"commit {fragment}/{round_}: {node}'s contribution was sent as it was killed"
                )
            else:
                outcome.fail("contributors", f"commit {fragment}/{round_} counts {node} ({contributor['steps']} "
                             "steps), which never logged sending it, and no lost answer or kill explains it")  # fmt: skip
    return merged, unused


def same_contribution(sent: dict, contributor: dict) -> bool:
    """A logged contribution_sent and a commit's contributor entry: the same payload sha where both carry
    one (lives of one node may send the same steps to one round), else the same steps."""
    if "blob" in sent and "blob" in contributor:
        return sent["blob"] == contributor["blob"]
    return sent["steps"] == contributor["steps"]


def told_missed(life: LifeRecord, index: int, merged: dict) -> list[dict]:
    """This life's merged contributions for which it was nonetheless told that its contribution missed the
    round (a contribution_late event): their steps were carried into its next contribution."""
    mine = [sent for (i, _), contributions in merged.items() if i == index for sent in contributions]
    late = [e["data"] for e in life.events if e["kind"] == "contribution_late"]
    return [sent for sent in mine if any((d["fragment"], d["round"], d["steps"]) ==
                                         (sent["fragment"], sent["round"], sent["steps"]) for d in late)]  # fmt: skip


def check_fates(lives: list[LifeRecord], merged: dict, outcome: Outcome) -> None:
    for index, life in enumerate(lives):
        for sent in told_missed(life, index, merged):
            outcome.fail("fates", f"{life.name}'s contribution to {sent['fragment']}/{sent['round']} "
                         f"({sent['steps']} steps) is in the commit, yet it was told it missed the round "
                         "(contribution_late) and carried those steps into its next contribution: merged twice")  # fmt: skip


def lost_answer(lives: list[LifeRecord], node: str, fragment: int, round_: int) -> tuple[int, int] | None:
    """The life of `node` whose PUT of this contribution's record landed with its answer lost, and the step
    it had reached by then (its last progress line); None if no life logged such a failure."""
    key = keys.contribution(fragment, round_, node)
    for index, life in enumerate(lives):
        step = 0
        for event in life.events if life.node == node else []:
            if event["kind"] == "progress":
                step = event["step"]
            elif (
                event["kind"] in ("mailbox_error", "upload_failed")
                and f"PUT {key} {LOST_ANSWER}" in event["message"]
            ):
                return index, step
    return None


def killed_while_sending(lives: list[LifeRecord], node: str, fragment: int, round_: int) -> bool:
    """A killed life of `node` logged nothing for this round of this fragment or a later one: its record may
    have landed as it died, before it could log."""
    return any(
        life.node == node and life.killed
        and max((sent["round"] for sent in life.sent() if sent["fragment"] == fragment), default=0) < round_
        for life in lives
    )  # fmt: skip


def check_accounting(lives: list[LifeRecord], commits: dict, merged: dict, unused: list, fragments: int,
                     outcome: Outcome) -> None:  # fmt: skip
    """Nothing silently lost, nothing counted twice: a life that finished trained steps × fragments
    fragment-steps, and each is in a contribution merged while it ran, or in its steps_dropped, or in its
    steps_unconfirmed (published, awaiting a commit when it left; the run may have merged them since)."""
    for index, life in enumerate(lives):
        if life.result is None:
            continue
        stats = life.result["stats"]
        unconfirmed = stats.get("steps_unconfirmed", 0)
        contributions = [sent for f in range(fragments) for sent in merged.get((index, f), [])]
        in_commits = sum(sent["steps"] for sent in contributions)
        merged_after = sum(
            sent["steps"]
            for sent in contributions
            if (sent["fragment"], sent["round"]) in life.unconfirmed_rounds()
        )
        trained = stats["step"] * fragments
        if in_commits - merged_after + stats["steps_dropped"] + unconfirmed == trained:
            continue
        # Its own contributions left unpaired in a commit that names its node, and never reported late: it
        # took another life's contribution under its node id for its own.
        late_events = {
            (e["data"]["fragment"], e["data"]["round"])
            for e in life.events
            if e["kind"] == "contribution_late"
        }
        taken = sum(sent["steps"] for sent in unused[index] if (sent["fragment"], sent["round"]) not in late_events
                    and any(c["node"] == life.node for c in commits.get((sent["fragment"], sent["round"]), {}).get("contributors", [])))  # fmt: skip
        twice = sum(sent["steps"] for sent in told_missed(life, index, merged))
        reasons = []
        if twice:
            reasons.append(f"{twice} of them were merged, yet it was told it missed their round and carried them "
                           "into its next contribution")  # fmt: skip
        if taken:
            reasons.append(f"{taken} more it took for merged, but the commit holds another life's contribution "
                           "under its node id: lost without a word")  # fmt: skip
        explained = (
            reasons
            and in_commits - merged_after + stats["steps_dropped"] + unconfirmed + taken - twice == trained
        )
        outcome.fail(
            "accounting",
            f"{life.name} trained {stats['step']} steps × {fragments} fragments = {trained} fragment-steps, but "
            f"commits hold {in_commits} of them ({merged_after} merged after it left) and it reports "
            f"{stats['steps_dropped']} unmerged and {unconfirmed} unconfirmed: "
            + ("; ".join(reasons) if explained else "these must add up to what it trained"),
        )


def check_model(mailbox, commits: dict, outcome: Outcome) -> None:
    """align() loads each fragment's newest commit; the model is finite and learned."""
    torch.set_num_threads(1)
    heldout = heldout_windows(load_corpus())
    model = build_model("tiny", seed=0)
    outcome.loss_initial = evaluate(model, heldout)
    if read_run(mailbox) is None:
        outcome.fail("model", "the store holds no run: no node created it")
        return
    loaded = sl.align(model, mailbox=mailbox)
    newest = Counter(fragment for fragment, _ in commits)  # fragment -> its number of commits, 1..n
    for fragment, version in loaded.items():
        if version != newest[fragment]:
            outcome.fail("model", f"align() loaded commit {version} of fragment {fragment}, but the store's "
                                  f"newest is {newest[fragment]}")  # fmt: skip
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        outcome.fail("model", "the committed parameters hold NaN or infinite values")
    outcome.loss_final = evaluate(model, heldout)
    if not outcome.loss_final < outcome.loss_initial:
        outcome.fail(
            "model",
            f"held-out loss {outcome.loss_final:.3f} did not fall below the initial {outcome.loss_initial:.3f}",
        )


def measure(
    played, lives: list[LifeRecord], commits: dict, merged: dict, fragments: int, outcome: Outcome
) -> None:
    for index, life in enumerate(lives):
        reported = life.last_progress()
        (outcome.faults_killed if life.killed else outcome.faults_finished).update(reported["faults"])
        outcome.requests += reported["requests"]
        if life.result is not None:
            # Reported unmerged, and published before it left but merged by no commit since.
            stats = life.result["stats"]
            merged_after = sum(sent["steps"] for f in range(fragments) for sent in merged.get((index, f), [])
                               if (sent["fragment"], sent["round"]) in life.unconfirmed_rounds())  # fmt: skip
            outcome.lost_finished += stats["steps_dropped"] + stats.get("steps_unconfirmed", 0) - merged_after
        elif life.killed:
            # Steps after the snapshot of its last merged contribution, fragment by fragment.
            last = life.last_step()
            for fragment in range(fragments):
                merged_at = max((sent["step"] for sent in merged.get((index, fragment), [])), default=0)
                outcome.lost_killed += last - merged_at
    outcome.stall, outcome.stall_cause = longest_stall(played, lives, fragments)
    for when, kind, _ in played.done:
        if kind == "kill_leader" and (took := next_leader(played, when)) is not None:
            outcome.takeovers.append(took[0] - when)


def next_leader(played, after: float) -> tuple[float, str] | None:
    """The first new term in leader.json after `after` (the killed node's restarted life included)."""
    return next(((t, node) for t, node, _ in played.leaders if t > after and node), None)


def longest_stall(played, lives: list[LifeRecord], fragments: int) -> tuple[float, str]:
    """The longest wait for a fragment's next commit, between two commits as they first showed in the store
    (the monitor probes past head.json, a hint, as nodes do); and what happened in it, from the schedule,
    leader.json and the logs."""
    gaps = []
    for (f, r), start in played.commit_times.items():
        if (f, r + 1) in played.commit_times:
            gaps.append((played.commit_times[f, r + 1] - start, f, r))
    if not gaps:
        return 0.0, "fewer than two commits"
    seconds, fragment, round_ = max(gaps)
    start = played.commit_times[fragment, round_]
    end = start + seconds
    causes = []
    for when, kind, node in played.done:
        if kind in ("kill", "kill_leader") and start - 1.0 <= when <= end:
            took = next_leader(played, when)
            successor = took and (f"{took[1]}'s restarted life" if took[1] == node else took[1])
            causes.append(f"{'leader ' if kind == 'kill_leader' else ''}{node} killed at t={when:.1f}s"
                          + (f", {successor} leading from t={took[0]:.1f}s" if kind == "kill_leader" and took else ""))  # fmt: skip
    terms = [
        f"{node or 'nobody'} (term {term}) at t={t:.1f}s"
        for t, node, term in played.leaders
        if start < t <= end
    ]
    if terms:
        causes.append("leader.json taken by " + ", ".join(terms))
    commit_key = keys.commit(fragment, round_ + 1)
    errors = 0
    for life in lives:
        for wall, message in life.errors():
            t = wall - played.wall_origin
            if start <= t <= end:
                errors += 1
                if f"PUT {commit_key} {LOST_ANSWER}" in message:  # in the store, found by probing: no delay
                    causes.append(f"{commit_key} written at t={t:.1f}s with its answer lost")
    causes.append(f"{errors} failed requests logged meanwhile")
    return seconds, f"fragment {fragment} round {round_} → {round_ + 1}: " + "; ".join(causes)
