"""Records: small JSON objects that name payloads and carry the run's state. Untrusted bytes are data.

`decode` bounds a record's size and nesting, parses it (`wire.bounded_json`: never pickle, no NaN or
infinity, no integer beyond 64 bits, no key twice), and checks every field against its spec before
anyone reads it: whatever the bytes, a bad record raises PayloadError naming the field, its value and
the rule. A spec is a plain type or one of the few below; the *_FIELDS constants say what each record
holds. Checks across fields (a commit sits at the round it names) are left to the readers.
"""

import json
import math
import re
from dataclasses import dataclass
from typing import NoReturn

from ..errors import PayloadError
from ..wire import bounded_json
from ..wire.bounded_json import brief
from ..wire.payload import check_shape
from . import keys

MAX_RECORD_BYTES = 4 << 20  # run.json holds the schema and the plan; 4 MiB is ample for 100k tensors
READ_LIMIT = MAX_RECORD_BYTES + 1024  # what a GET of a record may return: the record plus its signature
# A blob this small travels inside the record that names it (`inline`, base64: a third more bytes), which
# for a small model costs less than a request of its own; run.json carries at most RUN_INLINE_BYTES so.
INLINE_BYTES = 64 << 10
RUN_INLINE_BYTES = 1 << 20
# Rounds, steps, samples, terms and beats stay at most 2**53 - 1: exact as float64 (weights are
# float(samples), and a JSON reader in any language keeps them exact), and a sum of a few never nears
# int64. A million samples a second for 285 years stays under it.
MAX_COUNT = 2**53 - 1


def encode(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


# ---- the spec vocabulary ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Int:
    """A JSON integer (never a boolean) from `low` to `high`."""

    low: int = 0
    high: int = MAX_COUNT

    def check(self, value: object, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high:
            _refuse(where, value, f"an integer from {self.low} to {self.high}")


@dataclass(frozen=True)
class Real:
    """A finite JSON number (never a boolean), at least `low`."""

    low: float = -math.inf

    def check(self, value: object, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            _refuse(where, value, "a finite number")
        if value < self.low:
            _refuse(where, value, f"a finite number ≥ {self.low}")


@dataclass(frozen=True)
class Text:
    """A string, matching all of `pattern` if one is given."""

    pattern: re.Pattern | None = None

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, str) or (self.pattern is not None and not self.pattern.fullmatch(value)):
            _refuse(where, value, "a string" + (f" matching {self.pattern.pattern}" if self.pattern else ""))


@dataclass(frozen=True)
class Maybe:
    """null, or a value matching `spec`."""

    spec: object

    def check(self, value: object, where: str) -> None:
        if value is not None:
            check(value, self.spec, where)


@dataclass(frozen=True)
class ListOf:
    """A list whose every item matches `item`."""

    item: object

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, list):
            _refuse(where, value, "a list")
        for index, item in enumerate(value):
            check(item, self.item, f"{where}[{index}]")


class Row:
    """A list of exactly len(items) values, the i-th matching items[i]: Row(Text(), SHAPE, Text())."""

    def __init__(self, *items: object) -> None:
        self.items = items

    def __repr__(self) -> str:
        return f"Row{self.items!r}"

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, list) or len(value) != len(self.items):
            _refuse(where, value, f"a list of {len(self.items)} values")
        for index, (item, spec) in enumerate(zip(value, self.items, strict=True)):
            check(item, spec, f"{where}[{index}]")


@dataclass(frozen=True)
class Object:
    """A JSON object holding `fields` (name -> spec); other fields pass unchecked."""

    fields: dict

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            _refuse(where, value, "a JSON object")
        check_fields(value, self.fields, where, nested=True)


@dataclass(frozen=True)
class Omittable:
    """A field that may be absent; when present, it matches `spec`."""

    spec: object


class Shape:
    """A tensor's shape: at most 32 dimensions ≥ 0, at most 2**53 - 1 values (`payload.check_shape`)."""

    def __repr__(self) -> str:
        return "SHAPE"

    def check(self, value: object, where: str) -> None:
        check_shape(value, where)


def check(value: object, spec: object, where: str) -> None:
    """Raise PayloadError, naming `where`, unless `value` matches `spec`: one of the specs above, a type,
    or a tuple of types (a plain int or float is never a boolean; the parser keeps numbers finite)."""
    if not isinstance(spec, type | tuple):
        spec.check(value, where)
        return
    kinds = spec if isinstance(spec, tuple) else (spec,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)
        raise PayloadError(f"{where} has type {type(value).__name__}, expected {names}")


def check_fields(record: dict, fields: dict, where: str, *, nested: bool = False) -> None:
    """Each of `fields` (name -> spec) in `record`; `where` names the record (`nested`: a value in one)."""
    for name, spec in fields.items():
        if name not in record:
            if isinstance(spec, Omittable):
                continue
            raise PayloadError(f"{where} lacks the field {name!r}")
        inner = f"{where}[{name!r}]" if nested else f"{where} field {name!r}"
        check(record[name], spec.spec if isinstance(spec, Omittable) else spec, inner)


def _refuse(where: str, value: object, expected: str) -> NoReturn:
    raise PayloadError(f"{where} is {brief(value)}, expected {expected}")


def decode(data: bytes, fields: dict[str, object], *, what: str) -> dict:
    """The record in `data`, a JSON object holding `fields` (name -> spec); PayloadError if it is not."""
    if len(data) > MAX_RECORD_BYTES:
        raise PayloadError(f"{what} is {len(data)} bytes, over the {MAX_RECORD_BYTES}-byte limit for records")
    record = bounded_json.loads(data, what=what, max_bytes=MAX_RECORD_BYTES)
    if not isinstance(record, dict):
        raise PayloadError(f"{what} is not a JSON object")
    check_fields(record, fields, what)
    return record


# ---- what each record holds ------------------------------------------------------------------------

COUNT = Int()  # a round, a step, a sample count, a term
NODE = Text(keys.NODE_ID)  # what Session accepts as a node_id
SHA256 = Text(re.compile(r"[0-9a-f]{64}"))  # a blob's key
BASE64 = Text(re.compile(r"[A-Za-z0-9+/]*={0,2}"))
SHAPE = Shape()
NUMBER = (int, float)  # any finite number

RUN_FIELDS = {
    "format": str,
    "run_id": str,
    "config": dict,  # compared whole with the joiner's; any JSON the parser accepts
    "schema": ListOf(Row(Text(), SHAPE, Text())),  # [name, shape, dtype] of each tensor
    "schema_digest": str,
    "plan": ListOf(ListOf(Text())),  # each fragment's tensor names
    "initial": ListOf(SHA256),  # each fragment's initial parameters
    "key_id": Omittable(Maybe(Text())),
    "frozen": Omittable(ListOf(Row(Text(), SHAPE, Text(), SHA256))),  # tensors never sent, checked at join
    "statistics": Omittable(ListOf(Text())),  # floating-point buffers: merged, left out of norm checks
    "inline": Omittable(ListOf(Row(SHA256, BASE64))),  # [sha, base64 bytes] of its small initial blobs
}
HEAD_FIELDS = {"versions": ListOf(COUNT)}
# A leader that leaves writes node "" and beat -1: the lease is vacant.
LEADER_FIELDS = {"node": Text(re.compile(f"(?:{keys.NODE_ID.pattern})?")), "term": COUNT, "beat": Int(-1)}
LEASE_FIELDS = {
    "node": NODE,
    "beat": COUNT,
    "step": COUNT,
    "samples": COUNT,
    "step_seconds": Real(0),
    "versions": Omittable(ListOf(COUNT)),
    "leader": Omittable(bool),
    "life": Omittable(Text()),  # one per start of the node: beats are compared within a life
    "host": Omittable(Text()),  # the machine and process writing it: a restart on the same machine
    "pid": Omittable(COUNT),  # knows at once whether the process it replaces is gone
    "written": Omittable(Real(0)),  # the store's time when it was written, as the node tells it (status)
}
# What a contribution claims, in its payload's header (protocol/contribution.py): where it sits (node,
# fragment, round) is its key, and its digest is what commits name it by.
CLAIM_FIELDS = {
    "base": COUNT,
    "samples": COUNT,
    "steps": COUNT,
    "final": bool,
    "step_seconds": Real(0),
    "norm": Real(),  # the merger rejects a negative one with its own reason
}
CONTRIBUTOR = Object(
    {"node": NODE, "blob": SHA256, "samples": COUNT, "steps": COUNT, "final": bool, "weight": Real(0),
     "norm": Omittable(Real(0))}  # the Δ's norm as the merger measured it
)  # fmt: skip
REJECTION = Object({"node": NODE, "reason": str})
COMMIT_FIELDS = {
    "fragment": COUNT,
    "round": COUNT,
    "params": SHA256,
    "outer_state": Maybe(SHA256),
    "outer_round": Omittable(COUNT),  # the round whose outer state `outer_state` is (absent: this one)
    "change": Maybe(SHA256),
    "snapshot": Omittable(bool),  # the params blob is stored (absent: true)
    "contributors": ListOf(CONTRIBUTOR),
    "rejected": ListOf(REJECTION),
    "merger": NODE,
    "flush_only": Omittable(bool),
    "live": Omittable(
        COUNT
    ),  # the nodes live as the round closed: the outer step took share contributors/live
    "stale": Omittable(bool),  # its steps ran on a stale anchor: the step took no momentum push
    "inline": Omittable(ListOf(Row(SHA256, BASE64))),  # [sha, base64 bytes] of its small blobs (INLINE_BYTES)
}


def check_run(record: dict, what: str) -> None:
    """run.json's fields agree: one initial blob per fragment, each planned tensor once and in the schema.
    For the reader of run.json, after `decode(data, RUN_FIELDS, ...)`."""
    names = [name for name, _, _ in record["schema"]]
    planned = [name for fragment in record["plan"] for name in fragment]
    if len(set(names)) != len(names) or len(set(planned)) != len(planned) or not set(planned) <= set(names):
        raise PayloadError(f"{what} plans tensors {brief(planned)} that are not each once in its schema")
    if len(record["initial"]) != len(record["plan"]):
        raise PayloadError(
            f"{what} names {len(record['initial'])} initial blobs for {len(record['plan'])} fragments"
        )
