"""Writing a round's commit, as light as the run's encoding: the change in the commit encoding every round,
the full parameters and the outer state only in a snapshot every K rounds (K so that snapshots stay a
small share of the traffic), all behind one create-once record.

A commit's `params` is the digest of its parameters, whether or not their blob is stored: a node rebuilds
them from the newest snapshot and the changes since (run.params_at) and checks them against it. With a
float32 commit encoding every commit is a snapshot and carries no change.

The outer state is read by a new merger alone, so it is written with a snapshot only every OUTER_EVERY
rounds; every commit names the newest one written (`outer_state`, and `outer_round` when it is older).
A change or parameters blob of at most records.INLINE_BYTES travels inside the record (`inline`, base64): the
node that reads the commit then needs no second request, which for a small model is most of the cost.
"""

import math
from collections.abc import Callable

from ..algorithms.method import WireOptions
from ..arrays import Arrays
from ..errors import PayloadError, PreconditionFailed
from ..events import Event
from ..mailbox.contract import Mailbox
from ..wire import payload
from ..wire.commit_change import encode_change
from ..wire.compress import compress
from . import keys, records
from .run import (
    KEEP_COMMITS,
    MAX_CHAIN,
    Run,
    advance_head,
    inline_blob,
    inlined,
    listed_etag,
    put_blob,
    read_commit,
)

SNAPSHOT_SHARE = 0.5  # the most a snapshot, spread over the rounds until the next, adds to a change
MAX_SNAPSHOT_EVERY = 32  # a joiner reads at most this many changes after the snapshot it starts from
# Rounds between two writes of the outer state (at the snapshot due then): it is as large as the parameters,
# and only a merger taking over reads it, carrying on from a state at most this many rounds old.
OUTER_EVERY = 8


class CommitWriter:
    def __init__(self, mailbox: Mailbox, run: Run, wire: WireOptions, node_id: str,
                 emit: Callable[[Event], None], compression: str | None = None) -> None:  # fmt: skip
        self.mailbox, self.run, self.node_id, self.emit = mailbox, run, node_id, emit
        # zstd, as the node's contributions: the change and the outer state. A snapshot's parameters stay as
        # packed, since a commit names their digest, which every node checks the parameters it rebuilds by.
        self.compression = compression
        self.encoding = wire.commit_dtype if wire.commit_dtype not in (None, "F32") else None
        self.snapshot_every = wire.snapshot_every
        self.residuals: dict[int, Arrays] = {}  # fragment -> what the commits' encoding has lost so far
        self.last_snapshot: dict[int, int] = {}  # fragment -> the round of its newest snapshot, when known
        self.last_outer: dict[
            int, tuple[int, str]
        ] = {}  # fragment -> (round, sha) of the outer state it wrote
        self.unreadable: dict[str, int] = {}  # commit key -> turns it failed its checks in (junk or squatted)

    def write(self, fragment: int, round_: int, params: Arrays, anchor: Arrays, state: Arrays, fields: dict,
              head: list[int]) -> tuple[Arrays, dict, int] | None:  # fmt: skip
        """Commit round `round_` of `fragment`: `params` as the method computed them on `anchor`, the outer
        `state`, and the record's other `fields`. Returns the parameters committed (anchor plus the decoded
        change), the record and the bytes of its change and parameters blobs, or None if another leader's
        commit is the round's."""
        header = self.run.expect(fragment=fragment, round=round_)
        inline: list[list[str]] = []  # [sha, base64] of the blobs the record carries
        committed, change_sha, residual, change_bytes = self._change(fragment, params, anchor, header, inline)
        snapshot = change_sha is None or self._snapshot_due(fragment, round_, change_bytes, bool(state))
        params_header = header | {"kind": "params"}
        blob_bytes = change_bytes
        if snapshot:
            data = payload.pack(committed, params_header)
            params_sha, blob_bytes = self._store(data, inline), blob_bytes + len(data)
            del data
        else:  # the digest of the payload a snapshot would hold, without building it
            params_sha = payload.digest_of(committed, params_header)
        outer_round, outer_sha, outer_written = self._outer(fragment, round_, snapshot, state, header, inline)
        record = {"fragment": fragment, "round": round_, "params": params_sha, "outer_state": outer_sha,
                  "change": change_sha, "snapshot": snapshot, **fields}  # fmt: skip
        if outer_sha is not None and outer_round != round_:
            record["outer_round"] = outer_round
        if inline:
            record["inline"] = inline
        carried = {sha for sha, _ in inline}
        written = [sha for sha in (params_sha if snapshot else None, change_sha, outer_written) if sha]
        written = [sha for sha in written if sha not in carried]
        if not self._write_create_once(fragment, round_, record, head, written):
            return None
        if residual is not None:
            self.residuals[fragment] = residual
        if snapshot:
            self.last_snapshot[fragment] = round_
        if outer_written:
            self.last_outer[fragment] = (round_, outer_written)
        return committed, record, blob_bytes

    def _outer(self, fragment: int, round_: int, snapshot: bool, state: Arrays, header: dict,
               inline: list[list[str]]):  # fmt: skip
        """(round, sha, sha written now or None) of the outer state this commit names: written at a snapshot
        once the last this merger wrote is OUTER_EVERY rounds old (a new merger writes its first at once),
        otherwise that one; a small one inside the commit that writes it. A method that keeps no state
        (e.g. DiLoCo without momentum) names none."""
        if not state:
            return round_, None, None
        last = self.last_outer.get(fragment)
        if last is not None and (not snapshot or round_ - last[0] < OUTER_EVERY):
            return last[0], last[1], None
        if not snapshot:  # a lossy chain's first commits by this merger: the outer state waits for a snapshot
            return round_, None, None
        sha = self._store(self._compressed(payload.pack(state, header | {"kind": "outer"})), inline)
        return round_, sha, sha

    def _store(self, data: bytes, inline: list[list[str]]) -> str:
        """Put a commit's blob, or, when it is small, add it to the record's `inline`; its sha."""
        if len(data) > records.INLINE_BYTES:
            return put_blob(self.mailbox, data)
        return inline_blob(data, inline)

    def _change(self, fragment: int, params: Arrays, anchor: Arrays, header: dict, inline: list[list[str]]):
        """(committed parameters, change sha, new residual, change bytes); without a lossy commit encoding,
        or when the change cannot be encoded, the commit is the parameters themselves."""
        if self.encoding is None:
            return params, None, None, 0
        try:
            committed, data, residual = encode_change(
                params, anchor, self.residuals.get(fragment), self.encoding, header
            )
        except PayloadError as error:  # e.g. a change beyond F16's range: this commit goes out in full only
            self.emit(Event("commit_change_skipped", self.node_id, f"fragment {header['fragment']} round "
                            f"{header['round']}: {error}", {"fragment": header["fragment"], "round": header["round"]}))  # fmt: skip
            self.residuals.pop(fragment, None)
            return params, None, None, 0
        data = self._compressed(data)
        return committed, self._store(data, inline), residual, len(data)

    def _compressed(self, data: bytes) -> bytes:
        return compress(data) if self.compression == "zstd" else data

    def _snapshot_due(self, fragment: int, round_: int, change_bytes: int, has_state: bool) -> bool:
        last = self.last_snapshot.get(fragment)
        if last is None:
            return True  # a merger that does not know where the chain starts begins one (never, in practice:
            # it learns the newest snapshot, the initial model's round 0 included, with the outer state)
        full = self.run.fragment_bytes(fragment) * (2 if has_state else 1)
        every = self.snapshot_every or min(
            MAX_SNAPSHOT_EVERY, max(1, math.ceil(full / (SNAPSHOT_SHARE * change_bytes)))
        )
        return round_ - last >= every

    def _write_create_once(
        self, fragment: int, round_: int, record: dict, head: list[int], written: list[str]
    ) -> bool:
        """Write the commit create-once; True if this record is the round's commit. written: the blobs put
        for it, deleted if another leader's commit is the round's and does not name them.

        Refused, the key holds either another leader's commit, or our own write whose answer was lost
        (a retried create-once then sees our object): the record says which. A record at the key that
        fails its checks on two reads in each of two turns (junk, or unsigned in a signed run) is no honest
        node's commit: it is replaced by compare-and-swap on its etag, so a squatted key never blocks its
        round for more than a turn."""
        key = keys.commit(fragment, round_)
        try:
            self.mailbox.put(key, records.encode(record), if_absent=True)
            return True
        except PreconditionFailed:
            pass
        existing = read_commit_twice(self.mailbox, fragment, round_)
        if existing == "unreadable":
            # Only on a second turn as well: two answers cut short in a row must not replace a real commit.
            self.unreadable[key] = self.unreadable.get(key, 0) + 1
            if self.unreadable[key] < 2:
                return False
            etag = listed_etag(self.mailbox, key)
            try:
                if etag is not None:
                    self.mailbox.put(key, records.encode(record), if_match=etag)
                    self.emit(Event("record_replaced", self.node_id, f"{key} failed its checks; replaced by "
                                    "this round's commit", {"key": key}))  # fmt: skip
                    return True
            except PreconditionFailed:
                pass  # replaced by another leader meanwhile: read it on the next turn
            return False
        if existing is not None and existing["params"] == record["params"]:
            return True
        theirs = {existing[field] for field in ("params", "outer_state", "change")} if existing else set()
        self.mailbox.delete([keys.blob(sha) for sha in written if sha not in theirs])
        if existing is not None:  # whoever wrote it may have died before moving head.json: move it for them
            advance_head(self.mailbox, list(head), fragment, round_)
        return False


def chain_garbage(fragment: int, round_: int, read: Callable[[int], dict | None]) -> list[str]:
    """The blobs no kept commit needs once round_ is committed: when commit round_ − KEEP_COMMITS + 1 is a
    snapshot, every kept commit rebuilds from it or after it, so the blobs of the chain before it (back to
    and with the snapshot that chain started from) go. read(round) gives a commit record of `fragment`."""
    oldest_kept = round_ - KEEP_COMMITS + 1
    record = read(oldest_kept) if oldest_kept > 1 else None
    if record is None or not record.get("snapshot", True):
        return []
    # An outer state stays while a kept commit names it (each names the newest its merger wrote).
    kept = {kept["outer_state"] for r in range(oldest_kept, round_ + 1) if (kept := read(r)) is not None}
    stale = []
    for old in range(oldest_kept - 1, max(0, oldest_kept - 1 - MAX_CHAIN), -1):
        if (earlier := read(old)) is None:
            break
        stale += [
            keys.blob(earlier[field])
            for field in ("params", "outer_state", "change")
            if earlier[field] and earlier[field] not in kept and earlier[field] not in inlined(earlier)
        ]
        if earlier.get("snapshot", True):
            break
    return stale


def read_commit_twice(mailbox: Mailbox, fragment: int, round_: int) -> dict | None | str:
    """The commit record at (fragment, round), None if absent, "unreadable" if it fails its checks on
    two reads (one answer cut short on its way fails them once)."""
    for _ in range(2):
        try:
            return read_commit(mailbox, fragment, round_)
        except PayloadError:
            continue
    return "unreadable"
