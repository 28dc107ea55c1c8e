"""A contribution is one object, rounds/<fragment>/<round>/<node>.delta: the node's Δ payload, whose header
carries the claims the merger weighs and judges it by (base, steps, samples, final, step time, norm).
One PUT to publish it, one GET to read it whole; its digest is what a commit names it by.
"""

from ..errors import PayloadError
from ..wire import payload
from ..wire.bounded_json import brief
from . import keys, records
from .run import Run

CLAIMS = "claims"  # the header field holding the claims, a JSON object (payload header values are strings)


def header(run: Run, fragment: int, round_: int, node: str, claims: dict) -> dict:
    """The payload header of a contribution: the fields every payload of the run has, and the claims."""
    base = run.expect(kind="delta", fragment=fragment, round=round_, node=node)
    return base | {CLAIMS: records.encode(claims).decode()}


def read(data: bytes, run: Run, fragment: int, round_: int, node: str) -> dict:
    """The contribution record of the object at (fragment, round, node): its claims, where it sits and its
    digest ("blob"). PayloadError if its bytes are over the run's limit, its header is not this run's, it
    names another place than where it sits, or its claims fail their specs; its tensors are checked when
    the merge unpacks it."""
    key = keys.contribution(fragment, round_, node)
    limit = run.max_payload_bytes(fragment)
    if len(data) > limit:
        raise PayloadError(f"{key} is {len(data)} bytes, over the run's limit of {limit} bytes")
    found = payload.read_header(data)
    for field in ("run", "schema", "kind"):
        expected = str(run.expect(kind="delta")[field])
        if found.get(field) != expected:
            raise PayloadError(f"{key}'s payload {field} is {brief(found.get(field))}, expected {expected!r}")
    place = (found.get("node"), found.get("fragment"), found.get("round"))
    if place != (node, str(fragment), str(round_)):
        raise PayloadError(f"contribution names node {brief(place[0])} fragment {brief(place[1])} round "
                           f"{brief(place[2])}, but sits at fragment {fragment} round {round_} for {node}")  # fmt: skip
    if CLAIMS not in found:
        raise PayloadError(f"{key}'s payload header lacks the field {CLAIMS!r}")
    claims = records.decode(found[CLAIMS].encode(), records.CLAIM_FIELDS, what=f"{key} {CLAIMS}")
    return claims | {"node": node, "fragment": fragment, "round": round_, "blob": payload.digest(data)}
