"""DeMo's exchange over a mailbox, for nodes with no common fabric: each step every node PUTs its payload under
its own key and GETs the others' by key (never a LIST), waiting up to a deadline; then the step goes on with
what arrived, and who was missing is counted. The keys of old steps are deleted as the run goes.

    <prefix>/<step:012d>/<rank:05d>      one node's payload of one step (wire/coefficients.py)
"""

from ..clock import REAL, Clock
from ..errors import ConfigError, ObjectTooLarge
from ..mailbox.contract import Mailbox, check_key


class MailboxExchange:
    """Rank `rank` of `nodes` nodes sharing `mailbox`. deadline_seconds: how long a step waits for the others'
    payloads; poll_seconds: the first pause between two GETs of a missing payload (growing to 20 times it);
    keep_steps: how many steps of its own payloads a node leaves in the store for slower peers."""

    def __init__(
        self,
        mailbox: Mailbox,
        *,
        rank: int,
        nodes: int,
        deadline_seconds: float = 60.0,
        poll_seconds: float = 0.01,
        keep_steps: int = 8,
        prefix: str = "demo",
        clock: Clock = REAL,
    ) -> None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise ConfigError(f"MailboxExchange(nodes={nodes!r}): the number of nodes, a whole number ≥ 1")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < nodes:
            raise ConfigError(f"MailboxExchange(rank={rank!r}): this node's rank, in [0, {nodes})")
        for name, value in (("deadline_seconds", deadline_seconds), ("poll_seconds", poll_seconds)):
            if not isinstance(value, int | float) or not 0 < value < 86400:
                raise ConfigError(f"MailboxExchange({name}={value!r}): seconds, more than 0 and under a day")
        if isinstance(keep_steps, bool) or not isinstance(keep_steps, int) or keep_steps < 1:
            raise ConfigError(f"MailboxExchange(keep_steps={keep_steps!r}): a whole number of steps ≥ 1")
        self.mailbox, self.rank, self.nodes, self.clock = mailbox, rank, nodes, clock
        self.deadline_seconds, self.poll_seconds, self.keep_steps = deadline_seconds, poll_seconds, keep_steps
        self.prefix = check_key(prefix)
        self.missed: list[tuple[int, list[int]]] = []  # (step, the ranks whose payload did not come in time)
        self.oversized: list[tuple[int, int, str]] = []  # (step, rank, why): payloads larger than max_bytes

    def key(self, step: int, rank: int) -> str:
        return f"{self.prefix}/{step:012d}/{rank:05d}"

    def all_gather(self, payload: bytes, *, step: int, max_bytes: int) -> list[bytes | None]:
        self.mailbox.put(self.key(step, self.rank), payload)
        rows: list[bytes | None] = [None] * self.nodes
        rows[self.rank] = payload
        deadline, pause = self.clock.now() + self.deadline_seconds, self.poll_seconds
        while True:
            for peer in [r for r in range(self.nodes) if rows[r] is None]:
                try:
                    found = self.mailbox.get(self.key(step, peer), max_bytes=max_bytes)
                except ObjectTooLarge as error:  # more than any node of this run can send: never read
                    self.oversized.append((step, peer, str(error)))
                    found = None
                if found is not None:
                    rows[peer] = found.data
            left = deadline - self.clock.now()
            if all(row is not None for row in rows) or left <= 0:
                break
            self.clock.sleep(min(pause, left))
            pause = min(2 * pause, 20 * self.poll_seconds)
        missing = [r for r in range(self.nodes) if rows[r] is None]
        if missing:
            self.missed.append((step, missing))
        if step >= self.keep_steps:
            self.mailbox.delete([self.key(step - self.keep_steps, self.rank)])
        return rows
