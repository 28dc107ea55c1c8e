"""Records: small JSON objects that name payloads and carry the run's state. Untrusted bytes are data.

`decode` bounds the size, parses JSON (never pickle), and checks that required fields exist with the
expected types before anyone reads them; a bad record raises PayloadError with the reason.
"""

import json

from ..errors import PayloadError

MAX_RECORD_BYTES = 4 << 20  # run.json holds the schema and the plan; 4 MiB is ample for 100k tensors


def encode(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes, required: dict[str, type | tuple[type, ...]], *, what: str) -> dict:
    if len(data) > MAX_RECORD_BYTES:
        raise PayloadError(f"{what} is {len(data)} bytes, over the {MAX_RECORD_BYTES}-byte limit for records")
    try:
        record = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PayloadError(f"{what} is not valid JSON: {error}") from None
    if not isinstance(record, dict):
        raise PayloadError(f"{what} is not a JSON object")
    for field, kind in required.items():
        if field not in record:
            raise PayloadError(f"{what} lacks the field {field!r}")
        value = record[field]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float, (int, float))):
            raise PayloadError(f"{what} field {field!r} has type {type(value).__name__}, expected {kind}")
    return record


NUMBER = (int, float)

RUN_FIELDS = {
    "format": str,
    "config": dict,
    "schema": list,
    "schema_digest": str,
    "plan": list,
    "initial": list,
}
HEAD_FIELDS = {"versions": list}
LEADER_FIELDS = {"node": str, "term": int, "beat": int}
LEASE_FIELDS = {"node": str, "beat": int, "step": int, "samples": int, "step_seconds": NUMBER}
CONTRIBUTION_FIELDS = {
    "node": str,
    "fragment": int,
    "round": int,
    "base": int,
    "blob": str,
    "samples": int,
    "steps": int,
    "final": bool,
    "step_seconds": NUMBER,
    "norm": NUMBER,
}
COMMIT_FIELDS = {
    "fragment": int,
    "round": int,
    "params": str,
    "outer_state": (str, type(None)),
    "change": (str, type(None)),
    "contributors": list,
    "rejected": list,
    "merger": str,
}
