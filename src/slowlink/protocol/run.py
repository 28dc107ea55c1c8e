"""Creating and joining a run, head.json, and reading commit records: a constant number of requests each.

The first node writes its initial parameters as blobs, then run.json create-once; a racer that loses
adopts the winner's run. A joiner compares its configuration and schema with run.json and refuses on
any difference, then reads head.json and the newest commit of each fragment (chain.py rebuilds its
parameters), whatever the run's length.
"""

import base64
import binascii
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..arrays import Arrays
from ..errors import PayloadError, PreconditionFailed, RunConfigMismatch
from ..frameworks.base import compare_frozen, compare_schemas
from ..mailbox.contract import Mailbox
from ..wire import payload
from . import creation, keys, records
from .trust import ENVIRONMENT_VARIABLE

FORMAT = "slowlink-run-3"  # 2: a contribution is one object, head.json a hint; 3: small blobs inline (DESIGN-NOTES)
KEEP_COMMITS = 3  # the newest commits stay whole (with their chains), so joiners and new leaders find no hole
MAX_CHAIN = 128  # changes a reader applies after a snapshot at the most; a merger snapshots far more often
JOIN_ATTEMPTS = 5  # a joiner may race garbage collection of the commit it read; it then reads head again
# head.json is a hint: the merger moves it once a fragment is this many commits past what it names, and
# readers probe the commit keys after it, so it lags by fewer than HEAD_EVERY commits per fragment.
HEAD_EVERY = 4


@dataclass(frozen=True)
class Run:
    run_id: str
    config: dict
    schema: list
    schema_digest: str
    plan: list[list[str]]
    initial: list[str]  # blob sha256 of each fragment's initial parameters (version 0)
    key_id: str | None = None  # names the run key every record is signed with; None for an unsigned run
    frozen: list = field(default_factory=list)  # [name, shape, dtype, sha256] of each tensor never sent
    statistics: list = field(default_factory=list)  # floating-point buffers, synchronized but not norm-judged
    inline: list = field(default_factory=list)  # [sha, base64] of the initial blobs run.json carries

    @property
    def initial_record(self) -> dict:
        """What get_blob reads the initial model's inline blobs from, as it reads a commit's."""
        return {"inline": self.inline}

    def fragment_bytes(self, fragment: int) -> int:
        shapes = {name: shape for name, shape, _ in self.schema}
        return sum(4 * int(np.prod(shapes[name])) for name in self.plan[fragment])

    def shapes(self, fragment: int) -> dict[str, tuple[int, ...]]:
        """Each tensor of `fragment` with its shape in the run's schema: what every payload of it must hold."""
        shapes = {name: tuple(shape) for name, shape, _ in self.schema}
        return {name: shapes[name] for name in self.plan[fragment]}

    def max_payload_bytes(self, fragment: int) -> int:
        # float32 values plus headers, scales and slack; anything larger is not an honest payload.
        return 2 * self.fragment_bytes(fragment) + (1 << 20)

    def judged(self, arrays: Arrays) -> Arrays:
        """The tensors whose norm judges a contribution: all but the running statistics (BatchNorm's move
        with the data's scale, far more than any weight), unless a fragment holds nothing else."""
        judged = {name: values for name, values in arrays.items() if name not in self.statistics}
        return judged or arrays

    def expect(self, **fields: object) -> dict[str, object]:
        return {"run": self.run_id, "schema": self.schema_digest, **fields}


def put_blob(mailbox: Mailbox, data: bytes) -> str:
    """Store an immutable payload under its sha256; writing it twice is harmless."""
    sha = payload.digest(data)
    try:
        mailbox.put(keys.blob(sha), data, if_absent=True)
    except PreconditionFailed:
        pass  # same key means same bytes
    return sha


def inline_blob(data: bytes, inline: list[list[str]]) -> str:
    """Add `data` to a record's `inline` list rather than store it; its sha, as put_blob gives."""
    sha = payload.digest(data)
    inline.append([sha, base64.b64encode(data).decode()])
    return sha


def get_blob(mailbox: Mailbox, sha: str, max_bytes: int, record: dict | None = None) -> bytes:
    """The blob `sha`: from `record` (a commit, or run.initial_record) when it carries it inline, else from
    the mailbox."""
    for inline_sha, text in record.get("inline", []) if record is not None else []:
        if inline_sha == sha:
            if len(text) > 4 * (max_bytes // 3 + 1):
                raise PayloadError(f"the inline blob {sha[:16]}… is over {max_bytes} bytes")
            try:
                return base64.b64decode(text, validate=True)
            except binascii.Error as error:
                raise PayloadError(f"the inline blob {sha[:16]}… is not base64: {error}") from None
    found = mailbox.get(keys.blob(sha), max_bytes=max_bytes)
    if found is None or found.data is None:
        raise PayloadError(f"blob {sha[:16]}… is missing from the mailbox")
    return found.data


def inlined(record: dict) -> set[str]:
    """The blobs a record carries inline rather than names in the mailbox."""
    return {sha for sha, _ in record.get("inline", [])}


def read_run(mailbox: Mailbox) -> Run | None:
    found = mailbox.get(keys.RUN, max_bytes=records.READ_LIMIT)
    if found is None or found.data is None:
        return None
    record = records.decode(found.data, records.RUN_FIELDS | {"run_id": str}, what=keys.RUN)
    records.check_run(record, keys.RUN)
    if record["format"] != FORMAT and record["format"].startswith("slowlink-run-"):
        raise RunConfigMismatch(
            f"{keys.RUN} was written by a slowlink of protocol {record['format']!r}, but this node speaks "
            f"{FORMAT!r}: every node of a run needs a slowlink of the same protocol. Run this node with the "
            "slowlink that created the run, or start a new run under a new prefix"
        )
    if record["format"] != FORMAT:
        raise PayloadError(f"{keys.RUN} has format {record['format']!r}; this slowlink reads {FORMAT!r}")
    if not isinstance(record.get("key_id"), str | None):
        raise PayloadError(f"{keys.RUN} field 'key_id' is not a key id")
    return _run_of(record)


def _run_of(record: dict) -> Run:
    schema = [(name, tuple(shape), dtype) for name, shape, dtype in record["schema"]]
    key_id = record.get("key_id")
    return Run(record["run_id"], record["config"], schema, record["schema_digest"], record["plan"],
               record["initial"], key_id, record.get("frozen", []), record.get("statistics", []),
               record.get("inline", []))  # fmt: skip


def open_run(
    mailbox: Mailbox,
    *,
    config: dict,
    schema: list,
    schema_digest: str,
    plan: list[list[str]],
    initial: Callable[[], list[Arrays]],
    key_id: str | None = None,
    frozen: list | None = None,
    statistics: list | None = None,
    node_id: str = "a-node",
    claim_seconds: float = creation.CLAIM_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Run, bool]:
    """Join the run in `mailbox`, creating it from `initial()` if there is none. Returns (run, created).
    key_id: the id of the run key this node signs with (its mailbox is then `trust.Signed`), or None.
    frozen: [name, shape, dtype, sha256] of each tensor the model holds but never sends; a joiner's must match.
    Of nodes that find no run, one creates it while the others wait (creation.py: claim_seconds, clock, sleep)."""
    frozen = frozen or []
    existing = read_run(mailbox)
    if existing is None:
        found = creation.claim_or_find(
            mailbox, node_id, lambda: read_run(mailbox), claim_seconds=claim_seconds, clock=clock, sleep=sleep
        )
        if isinstance(found, creation.Claim):
            record = {
                "format": FORMAT,
                "run_id": uuid.uuid4().hex,
                "config": config,
                "schema": [[name, list(shape), dtype] for name, shape, dtype in schema],
                "schema_digest": schema_digest,
                "plan": plan,
                "key_id": key_id,
                **({"frozen": frozen} if frozen else {}),  # absent when there are none: run.json as it was
                **({"statistics": statistics} if statistics else {}),
            }
            with found:  # the claim's holder alone looks for another run's history: the others wait
                _refuse_over_history(mailbox)
                run = _create(mailbox, record, initial)
            if run is not None:
                return run, True
            found = read_run(mailbox)  # a node that never claimed (or took a stale claim) created it first
        existing = found
        assert existing is not None
    if existing.key_id != key_id:  # a signing node never gets here: it cannot read an unsigned run.json
        raise RunConfigMismatch(
            f"this run is signed with run key {existing.key_id}: give every node the same run_key= "
            f"(or {ENVIRONMENT_VARIABLE})"
        )
    compare_schemas(schema, existing.schema)
    compare_frozen(frozen, existing.frozen)
    check_config(config, existing.config)
    return existing, False


def _create(mailbox: Mailbox, record: dict, initial: Callable[[], list[Arrays]]) -> Run | None:
    """Upload the initial blobs (or carry the small ones inline, up to records.RUN_INLINE_BYTES in all),
    then run.json create-once; the run, or None when another's run.json won (this node's blobs are then
    deleted)."""
    shas, inline, written, carried = [], [], [], 0
    for q, arrays in enumerate(initial()):
        data = payload.pack(arrays, {"run": record["run_id"], "schema": record["schema_digest"],
                                     "kind": "params", "fragment": q, "round": 0})  # fmt: skip
        if len(data) <= records.INLINE_BYTES and carried + len(data) <= records.RUN_INLINE_BYTES:
            shas.append(inline_blob(data, inline))
            carried += len(data)
        else:
            shas.append(put_blob(mailbox, data))
            written.append(shas[-1])
    record = {**record, "initial": shas, **({"inline": inline} if inline else {})}
    if inline and len(records.encode(record)) > records.MAX_RECORD_BYTES:  # a schema of very many tensors
        for _, text in record.pop("inline"):
            written.append(put_blob(mailbox, base64.b64decode(text)))
    try:
        mailbox.put(keys.RUN, records.encode(record), if_absent=True)
    except PreconditionFailed:
        existing = read_run(mailbox)
        assert existing is not None
        if existing.run_id == record["run_id"]:  # our write landed; only its answer was lost
            return existing
        mailbox.delete([keys.blob(sha) for sha in written])
        return None
    return _run_of(record)


def _refuse_over_history(mailbox: Mailbox) -> None:
    """A run is never created where another's history lies: with run.json gone (deleted by hand, or by a
    lifecycle rule expiring old objects), a new run would mix its commits with the old ones."""
    for key in (keys.HEAD, keys.commit(0, 1)):
        try:
            present = mailbox.get(key, max_bytes=records.READ_LIMIT) is not None
        except PayloadError:
            present = True  # there, though unreadable to this node
        if present:
            raise RunConfigMismatch(
                f"{mailbox!r} holds {key} of a run but no {keys.RUN}: the run record was deleted (an S3 "
                "lifecycle rule expiring old objects does this). Restore run.json from a backup or another copy "
                "of the store, or start a new run under a new prefix; slowlink never creates a run over another "
                "run's history"
            )


def check_config(mine: dict, run: dict) -> None:
    differences = [
        f"{key}={mine.get(key)!r} here but {run.get(key)!r} in the run"
        for key in sorted(set(mine) | set(run))
        if mine.get(key) != run.get(key)
    ]
    if differences:
        raise RunConfigMismatch(
            "this node's algorithm configuration differs from the run's: "
            + "; ".join(differences)
            + ". Use the run's configuration, or a new mailbox prefix for a new run."
        )


Written = tuple[list[int], str | None]  # head.json's versions and etag, as written or read


def read_head(
    mailbox: Mailbox, fragments: int, *, etag: str | None = None
) -> tuple[list[int] | None, str | None]:
    """(versions, etag); versions is None when head.json still has `etag`. A missing head means all zeros."""
    found = mailbox.get(keys.HEAD, if_none_match=etag, max_bytes=records.READ_LIMIT)
    if found is None:
        return [0] * fragments, None
    if found.data is None:
        return None, found.etag
    versions = records.decode(found.data, records.HEAD_FIELDS, what=keys.HEAD)["versions"]
    if len(versions) != fragments or not all(isinstance(v, int) and v >= 0 for v in versions):
        raise PayloadError(f"{keys.HEAD} holds {versions!r}, not {fragments} round numbers")
    return versions, found.etag


def advance_head(
    mailbox: Mailbox, known: list[int], fragment: int, round_: int, last: Written | None = None
) -> Written:
    """Move the head of `fragment` forward to `round_` by compare-and-swap; never move it back. Returns
    head.json as it now stands (versions, etag).

    known: the newest commit of each fragment that this node has read and checked. last: head.json as this
    node last wrote it; while nobody else has written since, one PUT on that etag moves it. An unreadable
    head.json (forged, unsigned, garbled) is rewritten from `known` and the readable commits after them,
    never from a listing of commit keys, which anyone who can write to the store could fill with junk."""
    if last is not None and last[1] is not None:
        if last[0][fragment] >= round_:
            return last
        versions = [max(mine, theirs) for mine, theirs in zip(last[0], known, strict=True)]
        versions[fragment] = max(versions[fragment], round_)
        try:
            return versions, mailbox.put(keys.HEAD, records.encode({"versions": versions}), if_match=last[1])
        except PreconditionFailed:
            pass  # another leader moved it: read it, as below
    fragments = len(known)
    while True:
        try:
            versions, etag = _read_head_twice(mailbox, fragments)
            rebuilt = False
        except PayloadError:
            versions = [probe_newest(mailbox, q, version) for q, version in enumerate(known)]
            etag, rebuilt = listed_etag(mailbox, keys.HEAD), True
        assert versions is not None
        if versions[fragment] >= round_ and not rebuilt:
            return versions, etag
        versions = [max(theirs, mine) for theirs, mine in zip(versions, known, strict=True)]
        versions[fragment] = max(versions[fragment], round_)
        try:
            data = records.encode({"versions": versions})
            if etag is None:
                return versions, mailbox.put(keys.HEAD, data, if_absent=True)
            return versions, mailbox.put(keys.HEAD, data, if_match=etag)
        except PreconditionFailed:
            continue  # someone else moved it; read again


def _read_head_twice(mailbox: Mailbox, fragments: int) -> tuple[list[int] | None, str | None]:
    """read_head, with a second look before an unreadable head.json is taken for junk: one answer cut
    short on its way fails the checks too."""
    try:
        return read_head(mailbox, fragments)
    except PayloadError:
        return read_head(mailbox, fragments)


def listed_etag(mailbox: Mailbox, key: str) -> str | None:
    """The etag a LIST shows for `key`: what a compare-and-swap over an unreadable object needs."""
    etags = [listing.etag for listing in mailbox.list(key) if listing.key == key]
    return etags[0] if etags else None


def read_commit(mailbox: Mailbox, fragment: int, round_: int) -> dict | None:
    found = mailbox.get(keys.commit(fragment, round_), max_bytes=records.READ_LIMIT)
    if found is None or found.data is None:
        return None
    record = records.decode(found.data, records.COMMIT_FIELDS, what=keys.commit(fragment, round_))
    if record["fragment"] != fragment or record["round"] != round_:
        raise PayloadError(
            f"{keys.commit(fragment, round_)} names fragment {record['fragment']} round {record['round']}"
        )
    if record.get("outer_round", round_) > round_:
        raise PayloadError(f"{keys.commit(fragment, round_)} names the outer state of a later round, "
                           f"{record['outer_round']}")  # fmt: skip
    return record


def probe_newest(mailbox: Mailbox, fragment: int, version: int) -> int:
    """`version`, or a newer commit found by probing the keys after it: head.json names a commit only every
    few (HEAD_EVERY), and a merger may die before naming one. A junk or unverifiable record counts as absent."""
    while _commit_readable(mailbox, fragment, version + 1):
        version += 1
    return version


def newest_versions(mailbox: Mailbox, fragments: int) -> list[int]:
    """Each fragment's newest readable commit: head.json's hint, then a probe of the keys after it."""
    versions, _ = read_head(mailbox, fragments)
    assert versions is not None
    return [probe_newest(mailbox, q, version) for q, version in enumerate(versions)]


def search_newest(mailbox: Mailbox, fragment: int) -> int:
    """The newest readable commit of `fragment` without head.json: commits are never deleted, so rounds
    1..n all exist, and doubling then bisecting finds n in about 2·log₂ n reads. A junk key can only make
    the answer older than the truth, which the next head.json the node reads corrects."""
    low, high = 0, 1  # commit `low` exists (0: the initial model); `high` is being tried
    while _commit_readable(mailbox, fragment, high):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if _commit_readable(mailbox, fragment, middle) else (low, middle)
    return low


def _commit_readable(mailbox: Mailbox, fragment: int, round_: int) -> bool:
    for _ in range(2):  # a second look: one answer cut short is not a junk record
        try:
            return read_commit(mailbox, fragment, round_) is not None
        except PayloadError:
            continue
    return False
