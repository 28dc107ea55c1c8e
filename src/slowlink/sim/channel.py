"""One simulated worker's channel (engine/channel.py): contributions go to the hub at the worker's virtual
time, and commits come back once their virtual arrival time has come."""

from ..clock import VirtualClock
from ..engine.channel import Arrival, Contribution
from .hub import Hub


class SimChannel:
    def __init__(self, hub: Hub, worker: int, clock: VirtualClock) -> None:
        self.hub, self.worker, self.clock = hub, worker, clock
        self.failure: BaseException | None = None

    def publish(self, contribution: Contribution) -> None:
        self.hub.submit(self.worker, contribution, self.clock.now())

    def arrivals(self) -> list[Arrival]:
        return self.hub.take(self.worker, self.clock.now())

    def gather(self, deadline: float) -> Arrival | None:
        """The next commit if it arrives by `deadline`, moving the worker's clock to its arrival; the
        scheduler (run.py) calls it only once the hub has scheduled that commit."""
        arrives = self.hub.next_arrival(self.worker)
        if arrives is None or arrives > deadline:
            self.clock.advance(max(0.0, deadline - self.clock.now()))
            return None
        self.clock.advance(max(0.0, arrives - self.clock.now()))
        return self.hub.pop(self.worker)

    def live_nodes(self) -> set[str]:
        return {
            name
            for name, left in zip(self.hub.names, self.hub.live_until, strict=True)
            if left > self.clock.now()
        }

    def newest(self) -> list[int]:
        return list(self.hub.versions)
