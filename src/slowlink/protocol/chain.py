"""A fragment's parameters at a commit, rebuilt from the store: the newest snapshot at or before it and the
changes since (each step checked against the digest its commit names), and the newest commits a joiner
starts from. A bounded number of requests each, however long the run.
"""

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..arrays import Arrays
from ..errors import PayloadError
from ..mailbox.contract import Mailbox
from ..wire import payload
from . import keys
from .run import (
    JOIN_ATTEMPTS,
    KEEP_COMMITS,
    MAX_CHAIN,
    Run,
    get_blob,
    probe_newest,
    read_commit,
    read_head,
    search_newest,
)

PROBES_AT_ONCE = 8  # a joiner's probes for each fragment's newest commit, in flight together


def load_params(
    mailbox: Mailbox, run: Run, fragment: int, round_: int, sha: str, record: dict | None = None
) -> Arrays:
    """A commit's parameters; record: the commit's, which may carry them inline (None: the initial model)."""
    return _load_fragment(mailbox, run, fragment, round_, sha, "params", record)


def load_change(mailbox: Mailbox, run: Run, fragment: int, round_: int, record: dict) -> Arrays:
    """A commit's change Θ_round − Θ_(round−1), in the run's commit_dtype once decoded."""
    return _load_fragment(mailbox, run, fragment, round_, record["change"], "change", record)


def _load_fragment(
    mailbox: Mailbox, run: Run, fragment: int, round_: int, sha: str, kind: str, record: dict | None
) -> Arrays:
    data = get_blob(
        mailbox, sha, run.max_payload_bytes(fragment), record if record is not None else run.initial_record
    )
    arrays, _ = payload.unpack(
        data,
        expected_digest=sha,
        expect=run.expect(kind=kind, fragment=fragment, round=round_),
        max_bytes=run.max_payload_bytes(fragment),
        expect_shapes=run.shapes(fragment),
    )
    names = set(run.plan[fragment])
    if set(arrays) != names:
        raise PayloadError(
            f"{kind} of fragment {fragment} round {round_} hold {sorted(arrays)} not {sorted(names)}"
        )
    return arrays


def newest_params(
    mailbox: Mailbox, run: Run, fragment: int, version: int, own: Arrays | None = None
) -> tuple[int, Arrays]:
    """The parameters of `fragment` at `version` (0 is the run's initial model), and the version. If that
    commit cannot be rebuilt (its blobs collected meanwhile, or deleted), the newest older commit still kept
    stands in: the node then trains from it and catches up with the next commit it fetches. own: this
    node's parameters, which stand for the initial model without a download when they are it."""
    reasons = []
    for candidate in range(version, max(-1, version - KEEP_COMMITS - 1), -1):
        try:
            return candidate, params_at(mailbox, run, fragment, candidate, own=own)
        except PayloadError as error:
            reasons.append(f"round {candidate}: {error}")
    raise PayloadError(
        f"no parameters of fragment {fragment} can be loaded from its newest commits ({'; '.join(reasons)}). "
        "Wait for the run's next commit and join again, or restore the missing blobs from a copy of the store"
    )


def params_at(
    mailbox: Mailbox,
    run: Run,
    fragment: int,
    version: int,
    record: dict | None = None,
    own: Arrays | None = None,
) -> Arrays:
    """The parameters of commit `version`: the newest snapshot at or before it, plus the changes since, each
    step checked against the digest its commit names. At most MAX_CHAIN commits are read; `record`, the
    commit's record when the caller has just read it, is not read again; `own`, the node's own parameters,
    stand for the initial model (which a chain may start from) when their digest is its blob's."""
    chain = commit_chain(mailbox, fragment, version, record)
    first, record = chain[0]
    sha = run.initial[fragment] if record is None else record["params"]
    if record is None and own is not None and _is_initial(run, fragment, own):
        params = own  # most nodes start from the same seed: the creator, always
    else:
        params = load_params(mailbox, run, fragment, first, sha, record)
    for round_, record in chain[1:]:
        params = apply_change(mailbox, run, fragment, round_, params, record)
    return params


def apply_change(
    mailbox: Mailbox, run: Run, fragment: int, round_: int, held: Arrays, record: dict
) -> Arrays:
    """Commit `round_`'s parameters as `held` (the previous commit's) plus its encoded change; PayloadError if
    the change cannot be had or the sum is not exactly the parameters the commit names."""
    if record["change"] is None:
        raise PayloadError(f"{keys.commit(fragment, round_)} carries no change to apply")
    change = load_change(mailbox, run, fragment, round_, record)
    params = {name: held[name] + change[name] for name in held}
    if (
        payload.digest_of(params, run.expect(kind="params", fragment=fragment, round=round_))
        != record["params"]
    ):
        raise PayloadError("the held parameters plus the change differ from the commit's parameters")
    return params


def commit_chain(
    mailbox: Mailbox, fragment: int, version: int, newest: dict | None = None
) -> list[tuple[int, dict | None]]:
    """(round, record) from the newest snapshot at or before `version` up to `version`, oldest first; a chain
    that reaches back to the initial model starts with (0, None). newest: the record of `version`, if read."""
    chain: list[tuple[int, dict | None]] = []
    round_ = version
    while round_ > 0:
        record = (
            newest if round_ == version and newest is not None else read_commit(mailbox, fragment, round_)
        )
        if record is None:
            raise PayloadError(f"{keys.commit(fragment, round_)} is missing")
        chain.append((round_, record))
        if record.get("snapshot", True):
            return chain[::-1]
        if len(chain) > MAX_CHAIN:
            raise PayloadError(
                f"fragment {fragment} has no snapshot in the {MAX_CHAIN} commits before {version}"
            )
        round_ -= 1
    return [(0, None), *chain[::-1]]


def newest_snapshot(mailbox: Mailbox, fragment: int, version: int) -> tuple[int, dict | None]:
    """The newest snapshot commit at or before `version`, as (round, record); (0, None) for the initial model."""
    return commit_chain(mailbox, fragment, version)[0]


def _is_initial(run: Run, fragment: int, own: Arrays) -> bool:
    if set(own) != set(run.plan[fragment]):
        return False
    header = run.expect(kind="params", fragment=fragment, round=0)
    return payload.digest_of(own, header) == run.initial[fragment]


def load_newest(
    mailbox: Mailbox, run: Run, sleep: Callable[[float], None] = time.sleep,
    own: Callable[[int], Arrays] | None = None,
) -> dict[int, tuple[int, Arrays]]:  # fmt: skip
    """The newest commit of every fragment that can be loaded: head.json, then per fragment a probe for
    commits after the one it names, that commit and its blob. A constant number of requests. own(q): this
    node's parameters of fragment q, used instead of the initial model's blob when they are the same."""
    for attempt in range(JOIN_ATTEMPTS):
        try:
            versions, _ = read_head(mailbox, len(run.plan))
        except PayloadError:  # forged, or another run's: found by searching the commits instead
            versions = [search_newest(mailbox, q) for q in range(len(run.plan))]
        assert versions is not None
        try:
            # Every fragment's probe at once: joining waits one round trip for them, not one each.
            with ThreadPoolExecutor(min(PROBES_AT_ONCE, len(versions))) as pool:
                newest = list(
                    pool.map(probe_newest, [mailbox] * len(versions), range(len(versions)), versions)
                )
            return {
                q: newest_params(mailbox, run, q, version, own(q) if own else None)
                for q, version in enumerate(newest)
            }
        except PayloadError:
            if attempt == JOIN_ATTEMPTS - 1:
                raise
            sleep(0.1 * (attempt + 1))  # the commits we read were collected meanwhile: read head again
    raise AssertionError("unreachable")
