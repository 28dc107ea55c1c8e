"""The last requests of a node that leaves: first, in order, those another node needs done before it takes
over (a commit named in head.json, the contributions a merger kept); then the rest at once, each its own
chance, so that a store failing one still gets the others and nobody waits a lease for a node that left."""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..errors import MailboxError, PayloadError
from ..events import Event


def leave(node_id: str, first: list[Callable[[], object]], at_once: list[Callable[[], object]],
          emit: Callable[[Event], None]) -> KeyboardInterrupt | None:  # fmt: skip
    """Run `first` in order, then `at_once` together; a store's error becomes a mailbox_error event. Returns
    a KeyboardInterrupt one of them raised (the caller raises it once all have run), else None."""

    def attempt(part: Callable[[], object]) -> KeyboardInterrupt | None:
        try:
            part()
        except (MailboxError, PayloadError) as error:
            emit(Event("mailbox_error", node_id, f"while leaving: {error}"))
        except KeyboardInterrupt as error:
            return error
        return None

    outcomes = [attempt(part) for part in first]
    with ThreadPoolExecutor(max(1, len(at_once)), thread_name_prefix=f"slowlink-{node_id}-leave") as pool:
        outcomes += pool.map(attempt, at_once)
    return next((outcome for outcome in outcomes if outcome is not None), None)
