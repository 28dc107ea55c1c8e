"""A gossip node over a mailbox: what sl.Session becomes for GossipDiLoCo and NoLoCo. It joins the run
(run.json: configuration, schema and the initial model, as for every method), claims a rank of the roster,
and drives the gossip driver (engine/gossip.py) over the mailbox exchange (peers.py). No leader, no leases:
each node publishes, its partners read.
"""

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from ..algorithms.gossip import DELTA, START, GossipMethod
from ..clock import REAL
from ..engine.gossip import GossipNode
from ..engine.samples import count_of
from ..errors import ConfigError, SessionStateError
from ..events import Event, log_event
from ..frameworks.base import adapter_for, frozen_of, schema_digest
from ..mailbox.metered import Metered
from ..mailbox.named import open_mailbox
from ..wire import payload
from .peers import MailboxPeers, claim_rank
from .run import get_blob, open_run
from .trust import RunKey

# Session options a gossip node takes and has no use for yet (no leases, nothing to wait for on leaving).
IGNORED = frozenset({"lease_seconds", "close_timeout", "on_stall", "resume"})


@dataclass(frozen=True)
class GossipStats:
    """What this gossip node has done. Stall seconds are the training thread's waits for a mix; partners
    left out of a mix are counted by reason (missing, late, corrupt, schema)."""

    node: str
    rank: int
    step: int
    rounds: int
    mix1_stall_seconds: float
    mix2_stall_seconds: float
    self_mixed: dict[str, int]
    partner_distance: float | None  # the last round's mean relative L2 distance to this node's partners
    bytes_sent: dict[str, int]  # "blocking" (Δ) and "non_blocking" (starts)
    bytes_received: int


class GossipSession:
    """sl.Session's form for gossip methods (session.py hands these over): the same `with`, step(), stats."""

    def __init__(
        self, model: object, *, algorithm: GossipMethod, mailbox: object, node_id: str | None = None,
        on_event: Callable[[Event], None] | None = None, poll_seconds: float = 0.25, params: object = None,
        **unused: object,
    ) -> None:  # fmt: skip
        if algorithm.nodes is None:
            raise ConfigError(
                f"{type(algorithm).__name__}(nodes=None): a gossip run over a mailbox needs its roster's size to "
                f"draw the groups, e.g. {type(algorithm).__name__}(sync_every={algorithm.sync_every}, nodes=4)"
            )
        _refuse_unsupported(unused)
        if node_id is None:
            raise ConfigError(
                "a gossip node needs node_id=...: its rank in the roster is claimed under that name"
            )
        self.model, self.algorithm, self.node_id, self.params = model, algorithm, node_id, params
        self.mailbox = Metered(open_mailbox(mailbox))
        self.poll_seconds, self._on_event = poll_seconds, on_event
        self.events: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._state = "new"

    def __enter__(self) -> "GossipSession":
        if self._state != "new":
            raise SessionStateError("a Session can be entered once; create a new Session to train again")
        adapter = adapter_for(self.model, self.params)
        digest = schema_digest(adapter.schema)
        plan = self.algorithm.plan(adapter.schema)
        run, created = open_run(
            self.mailbox, config=self.algorithm.to_dict(), schema=adapter.schema, schema_digest=digest,
            plan=plan, initial=lambda: [adapter.snapshot(group) for group in plan], frozen=frozen_of(adapter),
            node_id=self.node_id,
        )  # fmt: skip
        if not created:  # every node starts from the run's initial model
            data = get_blob(
                self.mailbox, run.initial[0], run.fragment_bytes(0) + (1 << 20), run.initial_record
            )
            arrays, _ = payload.unpack(data, expected_digest=run.initial[0], expect=run.expect(kind="params"))
            adapter.assign(arrays)
        self.rank = claim_rank(self.mailbox, self.node_id, self.algorithm.nodes)
        self.peers = MailboxPeers(self.mailbox, run, self.rank, self.algorithm.nodes, node_id=self.node_id,
                                  emit=self._emit, clock=REAL, poll_seconds=self.poll_seconds)  # fmt: skip
        self.peers.start()
        self.node = GossipNode(node_id=self.node_id, method=self.algorithm, adapter=adapter, exchange=self.peers,
                               clock=REAL, emit=self._emit)  # fmt: skip
        self._state = "open"
        self._emit(Event("joined", self.node_id, f"rank {self.rank} of {self.algorithm.nodes} in a gossip run",
                         {"rank": self.rank}))  # fmt: skip
        return self

    def start(self) -> "GossipSession":
        return self.__enter__()

    def close(self) -> None:
        self.__exit__(None, None, None)

    def __exit__(self, *exc: object) -> None:
        if self._state != "open":
            return
        self._state = "closed"
        self.peers.stop()
        self._emit(Event("left", self.node_id, f"left after {self.node.step_count} steps",
                         {"steps": self.node.step_count}))  # fmt: skip

    @property
    def is_open(self) -> bool:
        return self._state == "open"

    def step(self, samples: int = 1) -> None:
        """Call after each optimizer step; a round's end mixes (waiting only for Mix2) and steps."""
        if self._state != "open":
            raise SessionStateError("session.step() was called outside the Session's `with` block")
        self.node.step(count_of(samples))

    def reset(self) -> None:
        raise SessionStateError("session.reset() is not available for gossip methods yet: load the model "
                                "before entering the Session")  # fmt: skip

    def _emit(self, event: Event) -> None:
        with self._lock:
            self.events[event.kind] += 1
        log_event(event)
        if self._on_event is not None:
            self._on_event(event)

    @property
    def stats(self) -> GossipStats:
        counters = self.node.counters
        distance = counters.partner_distance[-1][1] if counters.partner_distance else None
        return GossipStats(
            node=self.node_id, rank=self.rank, step=self.node.step_count, rounds=counters.rounds,
            mix1_stall_seconds=counters.stall_seconds[START], mix2_stall_seconds=counters.stall_seconds[DELTA],
            self_mixed=dict(counters.self_mixed), partner_distance=distance, bytes_sent=dict(self.peers.bytes_sent),
            bytes_received=self.peers.bytes_received,
        )  # fmt: skip

    def metrics(self) -> dict[str, float | None]:
        """Figures for a dashboard, all numbers (as Session.metrics)."""
        if self._state == "new":
            raise SessionStateError("session.metrics() is available once the Session is entered (`with`)")
        stats = self.stats
        return {
            "step": stats.step, "rounds": stats.rounds, "mix1_stall_seconds": stats.mix1_stall_seconds,
            "mix2_stall_seconds": stats.mix2_stall_seconds, "self_mixed": sum(stats.self_mixed.values()),
            "partner_distance": stats.partner_distance, "bytes_sent": sum(stats.bytes_sent.values()),
            "bytes_received": stats.bytes_received,
        }  # fmt: skip


def _refuse_unsupported(options: dict) -> None:
    """Options of sl.Session that a gossip run cannot honour yet are refused, never silently dropped: a run
    asked to sign its records must not run unsigned."""
    for name in ("run_key", "compression", "events_file"):
        if options.get(name) is not None:
            raise ConfigError(
                f"{name}= is not available for gossip methods yet: leave it out, or use sl.DiLoCo"
            )
    if RunKey.resolve(None) is not None:
        raise ConfigError(
            "SLOWLINK_RUN_KEY is set, but gossip runs are not signed yet: unset it for this run"
        )
    unknown = sorted(set(options) - IGNORED - {"run_key", "compression", "events_file"})
    if unknown:
        raise TypeError(f"Session() got an unexpected keyword argument {unknown[0]!r}")
