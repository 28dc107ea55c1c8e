"""What a run in a mailbox is doing, read from the store alone: configuration, nodes live and departed,
each fragment's newest rounds, bytes, stalls and leader changes. `slowlink status` draws it.

Reading never writes, and costs a constant number of requests however long the run: run.json,
head.json, leader.json, summary.json, one LIST and one GET per lease, and per fragment a probe past
head.json and its newest `recent` commit records. Departed nodes and the run's totals come from
summary.json (protocol/summary.py) when the merger keeps one, else from the newest commits.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..errors import PayloadError
from ..mailbox.contract import Listing, Mailbox, Object
from ..mailbox.metered import Metered
from ..protocol import keys, records
from ..protocol.run import HEAD_EVERY, read_commit, read_head, read_run
from ..protocol.summary import read_summary

# Commits looked for past the one head.json names: it lags by fewer than HEAD_EVERY, and a merger may
# have died before naming its newest.
HEAD_PROBES = HEAD_EVERY + 2
STALL_FACTOR = 5.0  # a gap between commits this many times the median gap is a stall
MIN_STALL_SECONDS = 2.0


class ReadOnly:
    """A mailbox that refuses to write: status and report only read, and this makes sure of it."""

    def __init__(self, inner: Mailbox) -> None:
        self.inner = inner

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        """Refused: a reader never writes."""
        raise AssertionError(f"status and report never write, yet tried to put {key}")

    def delete(self, keys: list[str]) -> None:
        """Refused: a reader never deletes."""
        raise AssertionError(f"status and report never delete, yet tried to delete {keys[:3]}")

    def get(
        self, key: str, *, if_none_match: str | None = None, max_bytes: int | None = None
    ) -> Object | None:
        """The wrapped mailbox's get."""
        return self.inner.get(key, if_none_match=if_none_match, max_bytes=max_bytes)

    def list(self, prefix: str, *, start_after: str | None = None) -> list[Listing]:
        """The wrapped mailbox's list."""
        return self.inner.list(prefix, start_after=start_after)

    def clock(self) -> float:
        """The wrapped mailbox's clock."""
        return self.inner.clock()


@dataclass
class NodeView:
    """One node of the run as the store shows it: its lease (live nodes) and its totals in commits."""

    node: str
    state: str  # "live" (written, or seen to change, within a lease), "quiet" (a lease without its write
    # time, not yet seen to change), "silent" (not rewritten for a lease or longer: crashed?), "departed"
    # (no lease: it left, its work is in commits)
    lease_age: float | None = None  # seconds since the lease was written (or seen to change); None if unknown
    watched: float = 0.0  # seconds this observer has watched its lease
    step: int | None = None
    samples: int | None = None
    steps_per_second: float | None = None
    lag: int | None = None  # rounds behind the newest commit, in its most behind fragment
    versions: list[int] | None = None
    is_leader: bool = False
    contributions: int | None = None  # commits holding its contribution (summary.json), or in the recent ones
    steps_merged: int | None = None  # its steps that reached a commit (the most of any fragment)
    samples_merged: int | None = None
    payload_bytes: int | None = None  # bytes of its contributions' payloads
    rejected: int = 0
    last_rejection: str | None = None
    last_round: list[int] | None = None  # [fragment, round] of its newest merged contribution
    rounds_merged: int = 0  # commits it wrote as the merger


@dataclass
class FragmentView:
    """One fragment: its newest round with merger, contributors and rejections, and its newest commits."""

    fragment: int
    round: int
    tensors: int
    merger: str | None = None
    contributors: list[dict] = field(default_factory=list)  # {"node", "samples", "steps", "weight"}
    rejected: list[dict] = field(default_factory=list)  # {"node", "reason"}
    recent: list[dict] = field(
        default_factory=list
    )  # the newest commits: {"round", "merger", "contributors", "rejected"}
    contributions: int | None = None  # totals from summary.json
    payload_bytes: int | None = None
    commit_bytes: int | None = None


@dataclass
class RunStatus:
    """Everything `slowlink status` shows; `to_dict()` is what `--json` prints."""

    mailbox: str
    run_id: str
    config: dict
    parameters: int
    signed: bool
    head: list[int]
    leader: str | None
    leader_term: int
    nodes: list[NodeView]
    fragments: list[FragmentView]
    bytes: dict  # {"contributions": n, "commits": n, "estimated": bool}
    leader_changes: list[dict]
    stalls: list[dict]  # {"start", "seconds", "fragment", "round"} gaps before a commit; "ongoing" for now
    last_commit_age: float | None  # seconds since the newest commit, by the store's clock
    summary: bool  # whether summary.json was there
    commits_unsummarized: int
    requests: int
    timeline: list[list] = field(default_factory=list)  # summary.json's, contributor indices as names

    def to_dict(self) -> dict:
        """The status as plain JSON-serializable values."""
        return asdict(self)


class StatusReader:
    """Reads a run's status; keeps what it saw between reads, so that `--watch` judges leases by how long
    they stayed unchanged on this observer's clock (never by comparing wall clocks)."""

    def __init__(
        self, mailbox: Mailbox, *, name: str = "", recent: int = 3, lease_seconds: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.mailbox = Metered(ReadOnly(mailbox))
        self.name, self.recent, self.lease_seconds, self.clock = (
            name or repr(mailbox),
            recent,
            lease_seconds,
            clock,
        )
        self._leases: dict[str, tuple[str, float | None, float]] = {}  # key -> (etag, changed at, first seen)

    def _observe(self, listing: list[Listing]) -> None:
        now = self.clock()
        present = {item.key: item.etag for item in listing if item.key.endswith(".json")}
        self._leases = {key: value for key, value in self._leases.items() if key in present}
        for key, etag in present.items():
            seen = self._leases.get(key)
            if seen is None:
                self._leases[key] = (etag, None, now)
            elif seen[0] != etag:
                self._leases[key] = (etag, now, seen[2])

    def read(self, *, observe_seconds: float = 0.0) -> RunStatus:
        """One look at the run. observe_seconds: list the leases again that long after the first listing,
        so that a one-off status can tell a live node (its lease changed) from a silent one."""
        began = self.clock()
        requests_before = self.mailbox.total_requests
        self._observe(self.mailbox.list(keys.NODES))
        run = read_run(self.mailbox)
        if run is None:
            raise PayloadError(f"{self.name} holds no run ({keys.RUN} is missing): check the path or prefix")
        fragments = len(run.plan)
        head, _ = read_head(self.mailbox, fragments)
        assert head is not None
        leader, term = _read_leader(self.mailbox)
        try:
            summary, _ = read_summary(self.mailbox, fragments)
        except PayloadError:
            summary = None  # unreadable: the newest commits still tell most of it
        views, commits = [], {}
        for q in range(fragments):
            newest = head[q]
            while newest - head[q] < HEAD_PROBES and read_commit(self.mailbox, q, newest + 1) is not None:
                newest += 1
            head[q] = newest
            commits[q] = [
                c
                for r in range(newest, max(0, newest - self.recent), -1)
                if (c := _commit(self.mailbox, q, r))
            ]
            views.append(_fragment_view(q, newest, len(run.plan[q]), commits[q], summary))  # fmt: skip
        leases = {}
        for key in sorted(self._leases):
            lease = _read_lease(self.mailbox, key)
            if lease is not None:
                leases[lease["node"]] = lease
        if observe_seconds > 0:
            time.sleep(max(0.0, observe_seconds - (self.clock() - began)))
            self._observe(self.mailbox.list(keys.NODES))
        nodes = self._node_views(leases, head, commits, summary, leader)
        payload_bytes, estimated = _bytes(summary, commits, head, self.mailbox)
        now = self.mailbox.clock()
        timeline = _named_timeline(summary)
        stalls = find_stalls([entry[0] for entry in timeline], now if leases else None)
        return RunStatus(
            mailbox=self.name, run_id=run.run_id, config=run.config,
            parameters=sum(_size(shape) for _, shape, _ in run.schema), signed=run.key_id is not None,
            head=head, leader=leader or None, leader_term=term, nodes=nodes, fragments=views,
            bytes={"contributions": payload_bytes, "estimated": estimated,
                   "commits": sum(v.commit_bytes or 0 for v in views) if summary is not None else None},
            leader_changes=(summary or {}).get("leader_changes") or _recent_leader_changes(commits),
            stalls=stalls, last_commit_age=(now - summary["updated"]) if summary and summary["updated"] else None,
            summary=summary is not None, commits_unsummarized=(summary or {}).get("commits_unsummarized", 0),
            requests=self.mailbox.total_requests - requests_before, timeline=timeline,
        )  # fmt: skip

    def _node_views(self, leases: dict, head: list[int], commits: dict, summary: dict | None,
                    leader: str | None) -> list[NodeView]:  # fmt: skip
        now, store_now = self.clock(), self.mailbox.clock()
        views: dict[str, NodeView] = {}
        for name, lease in leases.items():
            etag, changed, first = self._leases.get(keys.node(name), ("", None, now))
            age = None if changed is None else now - changed
            watched = now - first
            if "written" in lease:  # the store's time it was written, by the node's reckoning: no watching
                age = max(0.0, store_now - lease["written"])
                state = "live" if age < self.lease_seconds else "silent"
            elif age is not None and age < self.lease_seconds:
                state = "live"
            elif watched >= self.lease_seconds:
                state = "silent"
            else:
                state = "quiet"
            versions = lease.get("versions") if isinstance(lease.get("versions"), list) else None
            lag = max((h - v for h, v in zip(head, versions, strict=False) if isinstance(v, int)), default=0) if versions else None  # fmt: skip
            views[name] = NodeView(
                node=name, state=state, lease_age=age, watched=watched, step=lease["step"],
                samples=lease["samples"], versions=versions, lag=None if lag is None else max(0, lag),
                steps_per_second=1.0 / lease["step_seconds"] if lease["step_seconds"] > 0 else None,
                is_leader=name == leader,
            )  # fmt: skip
        if summary is not None:
            for name, totals in summary["nodes"].items():
                view = views.setdefault(name, NodeView(node=name, state="departed"))
                view.contributions = totals["contributions"]
                view.steps_merged, view.samples_merged = (
                    max(totals["steps"], default=0),
                    max(totals["samples"], default=0),
                )
                view.payload_bytes, view.rejected = totals["payload_bytes"], totals["rejected"]
                view.last_rejection, view.last_round = totals["last_rejection"], totals["last_round"]
                view.rounds_merged = totals["merged"]
        else:
            for q, newest in commits.items():
                for commit in newest:
                    for contributor in commit["contributors"]:
                        view = views.setdefault(
                            contributor["node"], NodeView(node=contributor["node"], state="departed")
                        )
                        view.contributions = (view.contributions or 0) + 1
                        if view.last_round is None or view.last_round[1] < commit["round"]:
                            view.last_round = [q, commit["round"]]
                    for rejection in commit["rejected"]:
                        view = views.setdefault(
                            rejection["node"], NodeView(node=rejection["node"], state="departed")
                        )
                        view.rejected += 1
                        view.last_rejection = view.last_rejection or rejection["reason"]
                    merger = views.setdefault(
                        commit["merger"], NodeView(node=commit["merger"], state="departed")
                    )
                    merger.rounds_merged += 1  # fmt: skip
        order = {"live": 0, "quiet": 1, "silent": 2, "departed": 3}
        return sorted(views.values(), key=lambda view: (order[view.state], view.node))


def _size(shape) -> int:
    size = 1
    for extent in shape:
        size *= int(extent)
    return size


def _read_leader(mailbox: Mailbox) -> tuple[str | None, int]:
    try:
        found = mailbox.get(keys.LEADER)
        if found is None or found.data is None:
            return None, 0
        record = records.decode(found.data, records.LEADER_FIELDS, what=keys.LEADER)
    except PayloadError:
        return None, 0
    return record["node"], record["term"]


def _read_lease(mailbox: Mailbox, key: str) -> dict | None:
    try:
        found = mailbox.get(key)
        if found is None or found.data is None:
            return None  # it left between the listing and the read
        return records.decode(found.data, records.LEASE_FIELDS, what=key)
    except PayloadError:
        return None


def _commit(mailbox: Mailbox, fragment: int, round_: int) -> dict | None:
    if round_ < 1:
        return None
    try:
        return read_commit(mailbox, fragment, round_)
    except PayloadError:
        return None


def _fragment_view(
    fragment: int, round_: int, tensors: int, commits: list[dict], summary: dict | None
) -> FragmentView:
    view = FragmentView(fragment=fragment, round=round_, tensors=tensors)
    if commits and commits[0]["round"] == round_:
        newest = commits[0]
        view.merger = newest["merger"]
        view.contributors = [{name: c.get(name) for name in ("node", "samples", "steps", "weight")} for c in newest["contributors"]]  # fmt: skip
        view.rejected = [{"node": r.get("node"), "reason": r.get("reason")} for r in newest["rejected"]]
    view.recent = [
        {"round": c["round"], "merger": c["merger"], "contributors": [x["node"] for x in c["contributors"]],
         "rejected": [{"node": r.get("node"), "reason": r.get("reason")} for r in c["rejected"]]}
        for c in commits
    ]  # fmt: skip
    if summary is not None:
        totals = summary["fragments"][fragment]
        view.contributions, view.payload_bytes, view.commit_bytes = (
            totals["contributions"],
            totals["payload_bytes"],
            totals["commit_bytes"],
        )
    return view


def _bytes(summary: dict | None, commits: dict, head: list[int], mailbox: Mailbox) -> tuple[int, bool]:
    """Bytes of every contribution's payload so far: summary.json's count, else an estimate from the
    payloads still in the round folders (one LIST) times the contributions the run has committed."""
    if summary is not None:
        return sum(totals["payload_bytes"] for totals in summary["fragments"]), summary[
            "commits_unsummarized"
        ] > 0
    sizes: dict[int, list[int]] = {}
    for listing in mailbox.list(keys.ROUNDS):
        parts = listing.key.split("/")
        if len(parts) == 4 and not parts[3].endswith(".json"):
            sizes.setdefault(int(parts[1]), []).append(listing.size)
    total = 0
    for q, newest in commits.items():
        if newest and sizes.get(q):
            per_round = statistics.mean(len(c["contributors"]) for c in newest)
            total += round(statistics.mean(sizes[q]) * per_round * head[q])
    return total, True


def _recent_leader_changes(commits: dict) -> list[dict]:
    changes = []
    for q, newest in commits.items():
        ordered = sorted(newest, key=lambda c: c["round"])
        for before, after in zip(ordered, ordered[1:], strict=False):
            if before["merger"] != after["merger"]:
                changes.append({"time": None, "fragment": q, "round": after["round"], "from": before["merger"], "to": after["merger"]})  # fmt: skip
    return changes


def _named_timeline(summary: dict | None) -> list[list]:
    if summary is None:
        return []
    names = summary["names"]
    return sorted(
        [time_, fragment, round_, [names[i] for i in contributors], rejected, names[merger]]
        for time_, fragment, round_, contributors, rejected, merger in summary["timeline"]
    )


def find_stalls(times: list[float], now: float | None = None) -> list[dict]:
    """Gaps between consecutive commits (times in seconds, any order) longer than STALL_FACTOR times the
    median gap and MIN_STALL_SECONDS; with `now`, the time since the newest commit too ("ongoing")."""
    times = sorted(times)
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    if len(gaps) < 2:
        return []
    threshold = max(MIN_STALL_SECONDS, STALL_FACTOR * statistics.median(gaps))
    stalls = [
        {"start": times[i], "seconds": gap, "ongoing": False} for i, gap in enumerate(gaps) if gap > threshold
    ]
    if now is not None and now - times[-1] > threshold:
        stalls.append({"start": times[-1], "seconds": now - times[-1], "ongoing": True})
    return stalls


def read_status(
    mailbox: Mailbox, *, name: str = "", recent: int = 3, observe_seconds: float = 0.0
) -> RunStatus:
    """One look at the run in `mailbox` (see StatusReader). Raises PayloadError if it holds no run."""
    return StatusReader(mailbox, name=name, recent=recent).read(observe_seconds=observe_seconds)
