"""The simulator's network: how long a message takes, from the models of research/algorithms.md §0 and §2.5.

    store      a contribution is a PUT and a commit a GET through each worker's own link to an object store:
               request_latency + latency + 8·S / min(link, store throughput), each way.
    allreduce  a round is one ring all-reduce among its contributors once all are in:
               T_AR(S) = 2(M−1)·λ + 2(M−1)/M · 8S/W (W the slowest link); each sends and receives 2(M−1)/M·S.
    pairwise   T_pair(S) = λ + 8S/W, full duplex (the exchange gossip methods use).
Bandwidths are in bits per second ("100Mbps" or a number), latencies in seconds ("30ms" or a number); a
list gives one link per worker.
"""

from dataclasses import dataclass, field

from ..errors import ConfigError
from ..plan.units import parse_bandwidth, parse_duration

EXCHANGES = ("store", "allreduce", "pairwise")


@dataclass(frozen=True)
class Store:
    """An object store (S3 and the like): each request waits `request_latency`, and moves bytes at most at
    `throughput` bits/s per request."""

    request_latency: float | str = 0.0
    throughput: float | str = float("inf")

    def __post_init__(self) -> None:
        object.__setattr__(self, "request_latency", _seconds("Store(request_latency=)", self.request_latency))
        object.__setattr__(self, "throughput", _bits("Store(throughput=)", self.throughput))


@dataclass(frozen=True)
class Network:
    bandwidth: float | str | list = float("inf")
    latency: float | str | list = 0.0
    exchange: str = "store"
    store: Store = field(default_factory=Store)

    def __post_init__(self) -> None:
        if self.exchange not in EXCHANGES:
            raise ConfigError(f"Network(exchange={self.exchange!r}) must be one of {EXCHANGES}")
        bandwidth = self.bandwidth if isinstance(self.bandwidth, list | tuple) else [self.bandwidth]
        latency = self.latency if isinstance(self.latency, list | tuple) else [self.latency]
        object.__setattr__(self, "bandwidth", tuple(_bits("Network(bandwidth=)", b) for b in bandwidth))
        object.__setattr__(self, "latency", tuple(_seconds("Network(latency=)", s) for s in latency))

    def link(self, worker: int) -> tuple[float, float]:
        """(bits/s, seconds) of the worker's link; one value given is every worker's."""
        pick = lambda values: values[worker] if len(values) > 1 else values[0]  # noqa: E731
        return pick(self.bandwidth), pick(self.latency)

    def check_workers(self, workers: int) -> None:
        for name, values in (("bandwidth", self.bandwidth), ("latency", self.latency)):
            if len(values) not in (1, workers):
                raise ConfigError(f"Network({name}=) lists {len(values)} links for {workers} workers: give one "
                                  "for all, or one per worker")  # fmt: skip

    def upload_seconds(self, worker: int, nbytes: int) -> float:
        """A contribution's PUT to the store."""
        return self._store_seconds(worker, nbytes)

    def download_seconds(self, worker: int, nbytes: int) -> float:
        """A commit's GET from the store."""
        return self._store_seconds(worker, nbytes)

    def allreduce_seconds(self, workers: list[int], nbytes: int) -> float:
        m = len(workers)
        if m < 2:
            return 0.0
        slowest = min(self.link(w)[0] for w in workers)
        latency = max(self.link(w)[1] for w in workers)
        return 2 * (m - 1) * latency + 2 * (m - 1) / m * 8 * nbytes / slowest

    def pairwise_seconds(self, a: int, b: int, nbytes: int) -> float:
        (bits_a, latency_a), (bits_b, latency_b) = self.link(a), self.link(b)
        return max(latency_a, latency_b) + 8 * nbytes / min(bits_a, bits_b)

    def _store_seconds(self, worker: int, nbytes: int) -> float:
        bits, latency = self.link(worker)
        return self.store.request_latency + latency + 8 * nbytes / min(bits, self.store.throughput)


def _bits(option: str, value: float | str) -> float:
    if isinstance(value, str):
        return parse_bandwidth(option, value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{option} {value!r} must be a positive bandwidth in bits/s, e.g. '100Mbps' or 1e8")
    return float(value)


def _seconds(option: str, value: float | str) -> float:
    if isinstance(value, str):
        return parse_duration(option, value, allow_zero=True)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"{option} {value!r} must be a duration in seconds ≥ 0, e.g. '30ms' or 0.03")
    return float(value)
