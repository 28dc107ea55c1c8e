"""What a merger's commits leave to tidy: summary.json to update, merged rounds' folders and the blobs no
kept commit needs to delete. Done every TIDY_SECONDS (and when the node leaves) in a request or two, from
what the merger already knows, rather than a read, a listing and a write per commit.
"""

from collections.abc import Callable, Iterable

from ..errors import MailboxError, PayloadError
from ..events import Event
from ..mailbox.contract import Listing, Mailbox
from . import keys
from .commits import chain_garbage
from .run import HEAD_EVERY, KEEP_COMMITS, MAX_CHAIN, read_commit
from .summary import Landed, record_commits

TIDY_SECONDS = 10.0  # how often the summary is folded and the garbage deleted


class Housekeeping:
    def __init__(self, mailbox: Mailbox, fragments: int, node_id: str, emit: Callable[[Event], None],
                 clock: Callable[[], float]) -> None:  # fmt: skip
        self.mailbox, self.fragments, self.node_id, self.emit, self.clock = (
            mailbox,
            fragments,
            node_id,
            emit,
            clock,
        )
        self.records: dict[tuple[int, int], dict] = {}  # (fragment, round) -> commit record, recent ones
        self.landed: list[Landed] = []  # commits written and not yet in summary.json
        self.garbage: set[str] = set()  # keys to delete on the next tidy
        self.payload_bytes: dict[tuple[int, int, str], int] = {}  # (fragment, round, node) -> payload size
        self.kept_from: dict[int, int] = {}  # fragment -> the oldest commit kept whole, as last collected
        self._tidied_at = clock()
        self.leaving = False  # the node leaves: its leave tidies once, off the path of the rounds it awaits

    def merged_rounds(self, listing: Iterable[Listing], head: list[int]) -> None:
        """Note the keys of a listing of rounds/ that sit in rounds before the newest commit: merged, or
        too late to be."""
        for item in listing:
            folder = keys.round_of(item.key)
            if folder is not None and folder[0] < len(head) and folder[1] < head[folder[0]]:
                self.garbage.add(item.key)

    def committed(self, fragment: int, round_: int, record: dict, blob_bytes: int, named: int) -> None:
        """A commit written: remember it for the summary and the blobs it makes garbage; tidy if due.
        named: the commit of this fragment head.json names, as this node last wrote or read it (head.json
        only moves forward, so that commit or a newer one): it stays whole too, for a joiner that reads it."""
        measured = {
            key[2]: self.payload_bytes.pop(key)
            for key in list(self.payload_bytes)
            if key[:2] == (fragment, round_)
        }
        sizes = {c["node"]: measured[c["node"]] for c in record["contributors"] if c["node"] in measured}
        self.landed.append(Landed(record, self.mailbox.clock(), sizes, blob_bytes))
        self.records[(fragment, round_)] = record
        self.collect(fragment, round_, named)
        for key in [
            key for key in self.records if key[0] == fragment and key[1] < round_ - KEEP_COMMITS - MAX_CHAIN
        ]:
            del self.records[key]
        self.tidy()

    def collect(self, fragment: int, newest: int, named: int) -> None:
        """Note the blobs no kept commit needs: the newest KEEP_COMMITS commits stay whole, and so does the
        one head.json names (`named`) and those after it, each with the chain back to its snapshot."""
        oldest_kept = min(newest - KEEP_COMMITS + 1, named)
        # From where the last collection stopped (head.json moves several commits at once), within reason: a
        # merger that finds itself far behind leaves the older garbage, as a new merger does.
        start = max(self.kept_from.get(fragment, oldest_kept - 1), oldest_kept - 2 * HEAD_EVERY)
        for kept in range(start + 1, oldest_kept + 1):
            self.garbage.update(
                chain_garbage(fragment, kept + KEEP_COMMITS - 1, lambda old: self.record(fragment, old))
            )
        self.kept_from[fragment] = max(start, oldest_kept)

    def record(self, fragment: int, round_: int) -> dict | None:
        """A commit record of this fragment: from memory if this node wrote or read it, else from the store."""
        record = self.records.get((fragment, round_))
        if record is None and (record := read_commit(self.mailbox, fragment, round_)) is not None:
            self.records[(fragment, round_)] = record
        return record

    def tidy(self, head: list[int] | None = None) -> None:
        """Every TIDY_SECONDS, or now with `head` (the node leaves: the rounds merged since the last
        listing go too): fold the commits written since into summary.json and delete the garbage they
        left. A store failure keeps them for the next time."""
        if head is None and (self.leaving or self.clock() - self._tidied_at < TIDY_SECONDS):
            return
        self._tidied_at = self.clock()
        if head is not None:
            self.merged_rounds(self.mailbox.list(keys.ROUNDS), head)
        if self.landed or head is not None:
            try:
                record_commits(self.mailbox, self.fragments, self.landed, head)
                self.landed = []
            except (MailboxError, PayloadError) as error:
                self.emit(Event("mailbox_error", self.node_id, f"summary.json not updated with "
                                f"{len(self.landed)} commit(s): {error}", {"error": type(error).__name__}))  # fmt: skip
        if self.garbage:
            self.mailbox.delete(sorted(self.garbage))
            self.garbage.clear()
