"""Chaos schedules and the conductor that plays one: learner processes started, SIGKILLed, restarted under
the same node id, and joining late, while a monitor watches head.json and leader.json in the store.

A schedule is a pure function of its seed. What it does to a run (which node is the leader when a
kill fires) depends on timing, so `play` records every action with its time and its resolved victim.
"""

import json
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from slowlink.protocol import keys, records
from slowlink.protocol.run import read_head

WORKER = Path(__file__).with_name("chaos_worker.py")
MONITOR_SECONDS = 0.1


@dataclass(frozen=True)
class Action:
    """One disturbance, once the furthest node has trained the share `at` of its steps: progress, not wall
    time, so that a kill lands mid-run however fast or busy the machine is."""

    kind: str  # "join" (start `node`), "kill" (a random running node), "kill_leader"
    at: float  # share of a life's steps, 0..1
    node: str | None = None  # join: which node
    restart_after: float | None = None  # kill: seconds until the victim restarts under its id; None: never


@dataclass(frozen=True)
class Schedule:
    seed: int
    nodes: tuple[str, ...]
    first: tuple[str, ...]  # started at once; the others join through actions
    actions: tuple[Action, ...]


def make_schedule(seed: int, *, nodes: int = 4, lease_seconds: float = 3.0) -> Schedule:
    """One or two late joiners, and two or three kills (at least one of the leader) between 5% and 60% of
    the way through the first nodes' steps; most kills are followed by a restart, some within the lease
    (the node takes its own leadership back), some after it (another node has taken over)."""
    rng = random.Random(seed)
    names = tuple(f"node-{i}" for i in range(nodes))
    late = rng.choice([1, 1, 2])
    actions = [Action("join", rng.uniform(0.0, 0.5), node=name) for name in names[-late:]]
    kinds = ["kill_leader"] + [rng.choice(["kill", "kill_leader"]) for _ in range(rng.randint(1, 2))]
    restarts = [rng.uniform(0.2, 2 * lease_seconds) if rng.random() < 0.75 else None for _ in kinds]
    if all(after is None for after in restarts):
        restarts[0] = rng.uniform(0.2, 2 * lease_seconds)
    actions += [
        Action(kind, rng.uniform(0.05, 0.6), restart_after=after)
        for kind, after in zip(kinds, restarts, strict=True)
    ]
    actions.sort(key=lambda action: action.at)
    return Schedule(seed, names, names[:-late], tuple(actions))


@dataclass
class Life:
    """One process of one node; a restarted node has several lives, each with its own log."""

    node: str
    life: int
    started: float  # seconds since the run began
    process: subprocess.Popen
    log: Path
    out: Path
    stderr: Path
    ended: float | None = None
    killed: bool = False
    returncode: int | None = None
    trained: int = 0  # steps, as its log last said
    read_to: int = 0  # bytes of its log read so far


@dataclass
class Played:
    """What happened: every life, every action with its time, and when each commit and leader appeared."""

    schedule: Schedule
    lives: list[Life] = field(default_factory=list)
    done: list[tuple[float, str, str]] = field(default_factory=list)  # (t, kind, node)
    unfired: list[Action] = field(default_factory=list)
    # (fragment, round) -> t when the commit record first showed in the store (probed past head.json)
    commit_times: dict[tuple[int, int], float] = field(default_factory=dict)
    leaders: list[tuple[float, str, int]] = field(default_factory=list)  # (t, node, term) on each change
    wall_origin: float = field(default_factory=time.time)  # time.time() at t=0, to place the logs' times
    seconds: float = 0.0
    timed_out: bool = False


class Conductor:
    """Plays one schedule against the run in `mailbox` (the store as workers see it, without faults)."""

    def __init__(self, schedule: Schedule, store: dict, mailbox, folder: Path, worker_args: dict,
                 fragments: int) -> None:  # fmt: skip
        self.schedule, self.store, self.mailbox, self.folder = schedule, store, mailbox, folder
        self.worker_args, self.fragments = worker_args, fragments
        self.played = Played(schedule)
        self.origin = time.monotonic()
        self.rng = random.Random(schedule.seed + 1)  # victims: the same choice for the same state
        self.head = [0] * fragments
        self.leader: tuple[str, int] | None = None
        self.restarts: list[tuple[float, str]] = []  # (when, node)

    def clock(self) -> float:
        return time.monotonic() - self.origin

    def play(self, deadline_seconds: float = 600.0) -> Played:
        for node in self.schedule.first:
            self.start(node)
        pending = list(self.schedule.actions)
        while True:
            now = self.clock()
            self.reap()
            self.watch_store(now)
            for when, node in sorted(self.restarts):
                if when <= now and node not in self.running():
                    self.restarts.remove((when, node))
                    self.start(node)
            progress = self.progress()
            for action in list(pending):
                # A join whose moment never comes (every node finished first) starts anyway.
                due = progress >= action.at * self.worker_args["steps"]
                if (due or (action.kind == "join" and not self.running())) and self.fire(action):
                    pending.remove(action)
            if not self.running() and not self.restarts and all(a.kind != "join" for a in pending):
                break
            if now > deadline_seconds:
                self.played.timed_out = True
                for life in self.running().values():
                    self.kill(life, "timeout", None)
                break
            time.sleep(MONITOR_SECONDS)
        self.played.unfired = pending
        self.played.seconds = self.clock()
        return self.played

    def running(self) -> dict[str, Life]:
        return {life.node: life for life in self.played.lives if life.ended is None}

    def progress(self) -> int:
        """The most steps any life has trained so far, from the progress lines of the lives' logs (each read
        on from where the last look stopped, whole lines only)."""
        for life in self.running().values():
            if not life.log.exists():
                continue
            with open(life.log, "rb") as log:
                log.seek(life.read_to)
                chunk = log.read()
            whole = chunk[: chunk.rfind(b"\n") + 1]
            life.read_to += len(whole)
            for line in whole.splitlines():
                if b'"progress"' in line:
                    life.trained = max(life.trained, json.loads(line)["step"])
        return max((life.trained for life in self.played.lives), default=0)

    def reap(self) -> None:
        for life in self.running().values():
            if (code := life.process.poll()) is not None:
                life.ended, life.returncode = self.clock(), code

    def watch_store(self, now: float) -> None:
        """Note when each commit and each new leader term first shows in the store."""
        versions, _ = read_head(self.mailbox, self.fragments)
        for fragment, (old, named) in enumerate(zip(self.head, versions, strict=True)):
            newest = max(old, named)  # head.json is a hint every few commits: probe past it, as nodes do
            while self.mailbox.get(keys.commit(fragment, newest + 1)) is not None:
                newest += 1
            for round_ in range(old + 1, newest + 1):
                self.played.commit_times[fragment, round_] = now
            self.head[fragment] = newest
        self.leader = read_leader(self.mailbox)
        leaders = self.played.leaders
        if self.leader is not None and (not leaders or leaders[-1][1:] != self.leader):
            leaders.append((now, *self.leader))

    def start(self, node: str) -> None:
        life = 1 + max((life.life for life in self.played.lives if life.node == node), default=-1)
        stem = self.folder / f"{node}.life{life}"
        args = self.worker_args | {"node": node, "index": self.schedule.nodes.index(node), "life": life,
                                   "store": self.store, "log": f"{stem}.jsonl", "out": f"{stem}.json"}  # fmt: skip
        with open(f"{stem}.stderr", "w") as stderr:
            process = subprocess.Popen([sys.executable, str(WORKER), json.dumps(args)],
                                       stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
        paths = [Path(f"{stem}.{suffix}") for suffix in ("jsonl", "json", "stderr")]
        self.played.lives.append(Life(node, life, self.clock(), process, *paths))
        self.played.done.append((self.clock(), "start" if life == 0 else "restart", node))

    def kill(self, life: Life, kind: str, restart_after: float | None) -> None:
        life.process.send_signal(signal.SIGKILL)
        life.process.wait()
        life.ended, life.killed, life.returncode = self.clock(), True, life.process.returncode
        self.played.done.append((life.ended, kind, life.node))
        if restart_after is not None:
            self.restarts.append((life.ended + restart_after, life.node))

    def fire(self, action: Action) -> bool:
        """Carry out `action` if it can be now; False keeps it pending. A kill never takes the last node."""
        if action.kind == "join":
            self.start(action.node)
            return True
        alive = self.running()
        if len(alive) < 2:
            return False
        if action.kind == "kill_leader":
            if self.leader is None or self.leader[0] not in alive:
                return False  # leader.json is vacant, or names a dead node not yet replaced: wait
            self.kill(alive[self.leader[0]], "kill_leader", action.restart_after)
        else:
            self.kill(alive[self.rng.choice(sorted(alive))], "kill", action.restart_after)
        return True

    def stop_all(self) -> None:
        """Kill whatever still runs, so that an interrupted benchmark leaves no orphans."""
        for life in self.played.lives:
            if life.process.poll() is None:
                life.process.kill()
                life.process.wait()


def read_leader(mailbox) -> tuple[str, int] | None:
    found = mailbox.get(keys.LEADER)
    if found is None or found.data is None:
        return None
    record = records.decode(found.data, records.LEADER_FIELDS, what=keys.LEADER)
    return record["node"], record["term"]
