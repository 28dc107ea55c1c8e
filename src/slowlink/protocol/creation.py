"""The creation claim: of the nodes that start a run at once, one uploads the initial model; the rest wait.

run.json's create-once alone keeps a run single, but each racer would upload its whole initial model before
trying it (the losers then delete theirs). creating.json, create-once and beaten while its holder uploads,
makes the others wait for run.json instead. A claim that stops changing for `claim_seconds`, on the
waiter's clock, is taken over by compare-and-swap; run.json's create-once still decides whatever happens.
"""

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import MailboxError, MailboxUnavailable, PayloadError, PreconditionFailed
from ..mailbox.contract import Mailbox
from . import keys, records

CLAIM_SECONDS = 15.0  # a claim unchanged this long is a creator gone; a live one rewrites it every fifth
Found = TypeVar("Found")


class Claim:
    """The right to create the run, held while `beating`: a thread rewrites creating.json every
    `claim_seconds / 5`, so that waiters see its holder alive through an upload of any length."""

    def __init__(self, mailbox: Mailbox, node_id: str, etag: str, claim_seconds: float) -> None:
        self.mailbox, self.node_id, self.etag = mailbox, node_id, etag
        self.every = claim_seconds / 5
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="slowlink-creation-claim", daemon=True)

    def __enter__(self) -> "Claim":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def release(self) -> None:
        """Stop beating and drop the claim, whether the run was created or creating it failed (then a
        waiter claims at once rather than after `claim_seconds`)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        try:
            self.mailbox.delete([keys.CREATING])
        except MailboxError:
            pass  # left behind, it goes stale; nobody reads it once run.json is there

    def _beat(self) -> None:
        beat = 1
        while not self._stop.wait(self.every):
            try:
                self.etag = self.mailbox.put(keys.CREATING, _record(self.node_id, beat), if_match=self.etag)
                beat += 1
            except PreconditionFailed:
                return  # taken over as stale: both may then create, and run.json's create-once picks one
            except MailboxError:
                continue  # a missed beat; the next one may land


def claim_or_find(
    mailbox: Mailbox,
    node_id: str,
    find: Callable[[], Found | None],
    *,
    claim_seconds: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> Claim | Found:
    """A Claim for this node to create with, or what another node created meanwhile (`find`), waiting
    while another holds the claim and taking it when it is given back or goes stale. A look the store
    fails is a look missed: the claim's age keeps counting, so faults cannot hold a dead claim forever."""
    seen: tuple[str, float] | None = None  # the claim's etag, and when this node first saw it
    # Looks start quick (a small model is up in moments) and slow down to a tenth of the timeout.
    poll, most_poll = min(0.02, claim_seconds / 10), min(1.0, claim_seconds / 10)
    while True:
        try:
            outcome, seen = _look(mailbox, node_id, find, claim_seconds, clock, seen)
            if outcome is not None:
                return outcome
        except (MailboxUnavailable, PayloadError):
            pass  # the next look may get through
        sleep(poll)
        poll = min(most_poll, 1.5 * poll)


def _look(
    mailbox: Mailbox,
    node_id: str,
    find: Callable[[], Found | None],
    claim_seconds: float,
    clock: Callable[[], float],
    seen: tuple[str, float] | None,
) -> tuple[Claim | Found | None, tuple[str, float] | None]:
    """One look: take the claim if there is none or it is stale, else look for the run; (what was got,
    the claim's etag as first seen). Once a claim was seen, the run is looked for first: its creator
    gives the claim back as soon as run.json is written, so that look alone ends most waits, and once more
    when the claim is gone (the first read may have crossed the write of run.json)."""
    looked = seen is not None
    if looked and (found := find()) is not None:
        return found, seen
    etag = _claim_etag(mailbox)
    if etag is None and looked and (found := find()) is not None:
        return found, seen  # the claim seen is gone: its holder has just written run.json, read it again
    if etag is not None and (seen is None or seen[0] != etag):
        seen = (etag, clock())
    stale = etag is not None and seen is not None and clock() - seen[1] >= claim_seconds
    if etag is None or stale:
        claim = _take(
            mailbox, node_id, claim_seconds, if_absent=etag is None, if_match=etag if stale else None
        )
        if claim is not None:
            try:
                found = find()  # made and given back just before this node claimed
            except BaseException:
                claim.release()
                raise
            if found is None:
                return claim, seen
            claim.release()
            return found, seen
    return (None if looked else find()), seen


def _take(
    mailbox: Mailbox,
    node_id: str,
    claim_seconds: float,
    *,
    if_absent: bool = False,
    if_match: str | None = None,
) -> Claim | None:
    try:
        etag = mailbox.put(keys.CREATING, _record(node_id, 0), if_absent=if_absent, if_match=if_match)
    except PreconditionFailed:
        return None
    return Claim(mailbox, node_id, etag, claim_seconds)


def _claim_etag(mailbox: Mailbox) -> str | None:
    """The claim's etag, from a listing: its content is never read, so no bytes there can mislead."""
    listed = [entry for entry in mailbox.list(keys.CREATING) if entry.key == keys.CREATING]
    return listed[0].etag if listed else None


def _record(node_id: str, beat: int) -> bytes:
    return records.encode({"node": node_id, "beat": beat, "time": time.time()})
