"""summary.json: a small record of the whole run, updated by the merger after each commit, so that
`slowlink status` and `slowlink report` know every node that ever contributed (leases vanish when nodes
leave) and the run's history without reading it all back.

`update_summary` is a pure function of the summary and one commit record; `record_commits` is the
merger's hook (read, update, compare-and-swap: two requests for any number of commits; the merger folds
its commits in every few seconds). The summary
stays bounded: per node and per fragment totals, the last MAX_TIMELINE commits (older ones thinned),
the last MAX_LEADER_CHANGES changes of merger. It is a report, never a commit point: nothing in the
protocol reads it, and a missing or unreadable one only costs the history before it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ..errors import PayloadError, PreconditionFailed
from ..mailbox.contract import Mailbox
from . import keys, records
from .run import inlined

SUMMARY = "summary.json"
FORMAT = "slowlink-summary-1"
MAX_TIMELINE = 256  # commits kept with their time and contributors; older ones are thinned to half
MAX_LEADER_CHANGES = 64
MAX_GAP_FILL = 16  # commits a summary update reads to catch up after a merger died between commit and summary
MAX_REASON = 200  # characters of a rejection's reason kept per node


def empty_summary(fragments: int) -> dict:
    """The summary of a run of `fragments` fragments before its first commit."""
    return {
        "format": FORMAT,
        "updated": None,  # the store's clock at the newest update
        "fragments": [
            {
                "round": 0,
                "commits": 0,
                "contributions": 0,
                "rejected": 0,
                "samples": 0,
                "steps": 0,
                "payload_bytes": 0,
                "commit_bytes": 0,
            }
            for _ in range(fragments)
        ],  # fmt: skip
        "nodes": {},
        "names": [],  # node names, indexed by the timeline's contributor lists
        "timeline": [],  # [time, fragment, round, [contributor indices], rejected count, merger index]
        "leader_changes": [],  # {"time", "fragment", "round", "from", "to"}
        "commits_unsummarized": 0,  # commits the summary missed for good (a gap beyond MAX_GAP_FILL)
    }


def _node(summary: dict, name: str, fragments: int) -> dict:
    if name not in summary["names"]:
        summary["names"].append(name)
    return summary["nodes"].setdefault(
        name,
        {"contributions": 0, "samples": [0] * fragments, "steps": [0] * fragments, "payload_bytes": 0,
         "payload_bytes_estimated": 0, "rejected": 0, "last_rejection": None, "merged": 0,
         "first_seen": None, "last_seen": None, "last_round": None},
    )  # fmt: skip


def update_summary(
    summary: dict, record: dict, *, time: float, payload_bytes: dict[str, int] | None = None,
    commit_bytes: int = 0,
) -> dict:  # fmt: skip
    """The summary with one more commit. `record` is the commit record as written
    (commits/<fragment>/<round>.json); `time` the store's clock when it landed; `payload_bytes` the size
    of each contributor's payload (node -> bytes; a node left out is estimated from its earlier ones);
    `commit_bytes` the size of the blobs the commit wrote. A commit already summarized changes nothing."""
    fragment, round_ = record["fragment"], record["round"]
    totals = summary["fragments"][fragment]
    if round_ <= totals["round"]:
        return summary
    summary = json.loads(json.dumps(summary))  # a fresh copy: the caller's summary is left as it was
    fragments = len(summary["fragments"])
    totals = summary["fragments"][fragment]
    payload_bytes = payload_bytes or {}
    previous_merger = summary["timeline"][-1][5] if summary["timeline"] else None
    totals.update(
        round=round_, commits=totals["commits"] + 1, commit_bytes=totals["commit_bytes"] + commit_bytes
    )
    contributors = []
    for contributor in record["contributors"]:
        name = str(contributor["node"])
        node = _node(summary, name, fragments)
        contributors.append(summary["names"].index(name))
        node["contributions"] += 1
        node["samples"][fragment] += int(contributor["samples"])
        node["steps"][fragment] += int(contributor["steps"])
        if name in payload_bytes:
            size = int(payload_bytes[name])
        else:  # its payload was collected before anyone measured it: the node's mean so far
            measured = node["contributions"] - 1 - node["payload_bytes_estimated"]
            size = node["payload_bytes"] // (node["contributions"] - 1) if measured > 0 else 0
            node["payload_bytes_estimated"] += 1
        node["payload_bytes"] += size
        node["first_seen"] = time if node["first_seen"] is None else node["first_seen"]
        node["last_seen"], node["last_round"] = time, [fragment, round_]
        totals["contributions"] += 1
        totals["samples"] += int(contributor["samples"])
        totals["steps"] += int(contributor["steps"])
        totals["payload_bytes"] += size
    for rejection in record["rejected"]:
        node = _node(summary, str(rejection["node"]), fragments)
        node["rejected"] += 1
        node["last_rejection"] = str(rejection["reason"])[:MAX_REASON]
        totals["rejected"] += 1
    merger = _node(summary, str(record["merger"]), fragments)
    merger["merged"] += 1
    merger_index = summary["names"].index(str(record["merger"]))
    if previous_merger is not None and previous_merger != merger_index:
        summary["leader_changes"].append({"time": time, "fragment": fragment, "round": round_,
                                          "from": summary["names"][previous_merger], "to": record["merger"]})  # fmt: skip
        del summary["leader_changes"][:-MAX_LEADER_CHANGES]
    summary["timeline"].append([time, fragment, round_, contributors, len(record["rejected"]), merger_index])
    if len(summary["timeline"]) > MAX_TIMELINE:  # thin the older half: every other entry goes
        half = MAX_TIMELINE // 2
        summary["timeline"] = summary["timeline"][:half:2] + summary["timeline"][half:]
    summary["updated"] = time
    return summary


def decode_summary(data: bytes, fragments: int) -> dict:
    """A summary read from the store, checked enough that update_summary and status can use it."""
    try:
        summary = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PayloadError(f"{SUMMARY} is not valid JSON: {error}") from None
    if not isinstance(summary, dict) or summary.get("format") != FORMAT:
        raise PayloadError(f"{SUMMARY} is not a {FORMAT} record")
    summary.pop("signature", None)  # a signed run's records carry one; the summary is read as a report
    template = empty_summary(fragments)
    for field, value in template.items():
        if not isinstance(summary.get(field), type(value) if value is not None else (int, float, type(None))):
            raise PayloadError(f"{SUMMARY} field {field!r} is missing or has the wrong type")
    if len(summary["fragments"]) != fragments:
        raise PayloadError(f"{SUMMARY} counts {len(summary['fragments'])} fragments, not {fragments}")
    if summary["updated"] is not None and not math.isfinite(summary["updated"]):
        raise PayloadError(f"{SUMMARY} field 'updated' is not a time")
    return summary


def read_summary(mailbox: Mailbox, fragments: int) -> tuple[dict | None, str | None]:
    """(summary, etag); (None, None) when there is none yet."""
    found = mailbox.get(SUMMARY, max_bytes=records.READ_LIMIT)
    if found is None or found.data is None:
        return None, None
    return decode_summary(found.data, fragments), found.etag


def _sizes(mailbox: Mailbox, record: dict) -> tuple[dict[str, int], int]:
    """The contributors' payload sizes (one LIST of the round's folder) and the commit's blob sizes."""
    fragment, round_ = record["fragment"], record["round"]
    blobs = {
        str(c["node"]): keys.contribution(fragment, round_, str(c["node"])) for c in record["contributors"]
    }
    listed = {listing.key: listing.size for listing in mailbox.list(keys.round_folder(fragment, round_))}
    payload_bytes = {node: listed[key] for node, key in blobs.items() if key in listed}
    commit_bytes = sum(len(text) * 3 // 4 for _, text in record.get("inline", []))  # (within 2 bytes)
    for field in ("params", "change"):
        if record.get(field) and record[field] not in inlined(record):
            commit_bytes += sum(item.size for item in mailbox.list(keys.blob(record[field])))
    return payload_bytes, commit_bytes


@dataclass(frozen=True)
class Landed:
    """A commit as the merger wrote it, waiting to be folded into the summary: its record, the store's
    clock when it landed, each contributor's payload size (node -> bytes) and its own blobs' size."""

    record: dict
    time: float
    payload_bytes: dict[str, int]
    commit_bytes: int


def record_commit(mailbox: Mailbox, fragments: int, record: dict) -> None:
    """Fold one commit into summary.json, measuring its sizes from listings (a merger folds many at once
    with record_commits and the sizes it already knows)."""
    payload_bytes, commit_bytes = _sizes(mailbox, record)
    record_commits(mailbox, fragments, [Landed(record, mailbox.clock(), payload_bytes, commit_bytes)])


def _fill_gap(mailbox: Mailbox, summary: dict, known: bool, fragment: int, before: int, time: float) -> dict:
    """`summary` with the commits of `fragment` it lacks before round `before` folded in from their records
    (the newest MAX_GAP_FILL of them; the older counted as unsummarized). A summary that is not `known`
    (none yet) fills nothing: its history begins here."""
    from .run import read_commit  # run.py stays free to import this module

    first_missing = summary["fragments"][fragment]["round"] + 1
    fill_from = max(first_missing, before - MAX_GAP_FILL) if known else before
    if fill_from > first_missing:
        # history this summary will never hold: a gap too long to read back, or a run that began before it
        summary = json.loads(json.dumps(summary))
        summary["commits_unsummarized"] += fill_from - first_missing
    for missed in range(fill_from, before):
        earlier = read_commit(mailbox, fragment, missed)
        if earlier is not None:
            summary = update_summary(summary, earlier, time=time)
    return summary


def record_commits(
    mailbox: Mailbox, fragments: int, landed: list[Landed], head: list[int] | None = None
) -> None:
    """The merger's hook: after writing commits (`landed`, in the order written), fold them into
    summary.json by compare-and-swap: one GET and one PUT however many. First folds in, from their
    records, the commits of each fragment the summary missed (a merger that died or lost the lead before
    folding its own), up to MAX_GAP_FILL; with `head` (the newest commit of each fragment, as a leaving
    merger knows it), those of every fragment up to it as well, which a fragment this merger never
    committed would otherwise miss for good. Raises MailboxError when the store fails: the merger keeps
    them for the next call."""
    while True:
        try:
            summary, etag = read_summary(mailbox, fragments)
        except PayloadError:  # unreadable (garbled, forged): start again from here, in its place
            summary = None
            etag = next((item.etag for item in mailbox.list(SUMMARY) if item.key == SUMMARY), None)
        base = summary if summary is not None else empty_summary(fragments)
        updated = base
        for entry in landed:
            fragment, round_ = entry.record["fragment"], entry.record["round"]
            updated = _fill_gap(mailbox, updated, summary is not None, fragment, round_, entry.time)
            updated = update_summary(updated, entry.record, time=entry.time, payload_bytes=entry.payload_bytes,
                                     commit_bytes=entry.commit_bytes)  # fmt: skip
            summary = updated  # the next entry's gaps are counted from this one
        if head is not None and summary is not None:  # a leaving merger: every fragment up to its head
            for fragment, newest in enumerate(head):
                updated = _fill_gap(mailbox, updated, True, fragment, newest + 1, mailbox.clock())
        if updated is base:
            return  # already summarized (a retried call, or two leaders racing)
        data = json.dumps(updated, sort_keys=True, separators=(",", ":")).encode()
        try:
            if etag is None:
                mailbox.put(SUMMARY, data, if_absent=True)
            else:
                mailbox.put(SUMMARY, data, if_match=etag)
            return
        except PreconditionFailed:
            continue  # another merger updated it meanwhile: read it again
