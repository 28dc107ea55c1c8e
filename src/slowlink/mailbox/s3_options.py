"""How S3Mailbox connects and waits: its retry policy and timeouts (values given to its constructor),
and the botocore client built from its options (begun in the background as the mailbox is made), with
the checks those options pass first.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import botocore.loaders
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError

from ..errors import ConfigError

_LOADER: botocore.loaders.Loader | None = None  # shared by all mailboxes' clients, see make_client
_LOADER_LOCK = threading.Lock()
# A child forked while another thread made a client would find the lock held for ever: it gets a free one.
os.register_at_fork(after_in_child=lambda: globals().update(_LOADER_LOCK=threading.Lock()))

CHECKSUM_MODES = ("when_supported", "when_required")  # the values of request_checksums

# S3's documented limits (AWS; MinIO and R2 share them): a single PutObject carries at most 5 GiB, a multipart
# upload at most 10,000 parts of 5 MiB to 5 GiB each (the last may be smaller), an object at most 5 TiB.
MAX_SINGLE_PUT_BYTES = 5 << 30
MIN_PART_BYTES, MAX_PART_BYTES, MAX_PARTS = 5 << 20, 5 << 30, 10_000
MAX_OBJECT_BYTES = 5 << 40
# Above 64 MiB a put goes up in 16 MiB parts: a failed part costs 16 MiB again, not the whole payload,
# and 10,000 of them carry up to 156 GiB. Below it one PutObject is one request instead of three or more.
DEFAULT_MULTIPART_THRESHOLD, DEFAULT_PART_SIZE = 64 << 20, 16 << 20


@dataclass(frozen=True, kw_only=True)
class Retries:
    """How a request that failed transiently is tried again.

    `attempts` counts every try, the first included. Before retry k (k = 1, 2, ...) the request sleeps
    uniform(0, min(max_backoff, first_backoff * 2**(k-1))) seconds: full jitter, so nodes that failed
    together do not come back together.
    """

    attempts: int = 8
    first_backoff: float = 0.2
    max_backoff: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigError(
                f"Retries(attempts={self.attempts!r}) must be an integer >= 1 (1 means never retry)"
            )
        if not 0 <= self.first_backoff <= self.max_backoff:
            raise ConfigError(
                f"Retries(first_backoff={self.first_backoff}, max_backoff={self.max_backoff}) needs "
                "0 <= first_backoff <= max_backoff, in seconds"
            )

    def backoff(self, retry: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.max_backoff, self.first_backoff * 2 ** (retry - 1)))


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    """Seconds one try may wait: to open a connection, and for each read of the answer."""

    connect: float = 10.0
    read: float = 60.0

    def __post_init__(self) -> None:
        if not (self.connect > 0 and self.read > 0):
            raise ConfigError(f"Timeouts(connect={self.connect}, read={self.read}) must both be > 0 seconds")


def check_client_options(
    *, endpoint_url: str | None, request_checksums: str, max_concurrency: int, addressing_style: str | None,
    multipart_threshold: int, part_size: int,
) -> None:  # fmt: skip
    """Raise ConfigError, naming the option, unless each option of the client and of uploads is accepted."""
    if request_checksums not in CHECKSUM_MODES:
        raise ConfigError(
            f"S3Mailbox request_checksums={request_checksums!r} must be one of {CHECKSUM_MODES}; "
            "'when_required' is what Hugging Face Storage Buckets need"
        )
    if not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ConfigError(f"S3Mailbox max_concurrency={max_concurrency!r} must be an integer >= 1")
    if endpoint_url is not None and not endpoint_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"S3Mailbox endpoint_url={endpoint_url!r} must start with http:// or https://, "
            "e.g. 'http://127.0.0.1:9000' for MinIO"
        )
    if addressing_style not in (None, "auto", "path", "virtual"):
        raise ConfigError(
            f"S3Mailbox addressing_style={addressing_style!r} must be 'auto', 'path' or 'virtual'"
        )
    _check_upload_sizes(multipart_threshold, part_size)


def _check_upload_sizes(multipart_threshold: int, part_size: int) -> None:
    def whole(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not whole(part_size) or not MIN_PART_BYTES <= part_size <= MAX_PART_BYTES:
        raise ConfigError(
            f"S3Mailbox part_size={part_size!r} must be a whole number of bytes from {MIN_PART_BYTES} (5 MiB, "
            f"S3's smallest part) to {MAX_PART_BYTES} (5 GiB, its largest); the default is {DEFAULT_PART_SIZE}"
        )
    if not whole(multipart_threshold) or not 0 <= multipart_threshold <= MAX_SINGLE_PUT_BYTES:
        raise ConfigError(
            f"S3Mailbox multipart_threshold={multipart_threshold!r} must be a whole number of bytes from 0 to "
            f"{MAX_SINGLE_PUT_BYTES} (5 GiB, the most one PutObject carries); the default is "
            f"{DEFAULT_MULTIPART_THRESHOLD}"
        )


class _S3Loader(botocore.loaders.Loader):
    """Botocore's loader of service descriptions, for S3 clients only. Botocore checks that the service is
    among those installed by listing every service's folder (about 400, a third of the CPU time of a first
    client); S3 is always installed, so the list is the one service this loader loads."""

    def list_available_services(self, type_name: str) -> list[str]:
        return ["s3"]


def _new_loader() -> _S3Loader:
    """Searching AWS_DATA_PATH first, as botocore's own loader does."""
    paths = os.environ.get("AWS_DATA_PATH")
    extra = (
        [os.path.expanduser(os.path.expandvars(path)) for path in paths.split(os.pathsep)] if paths else None
    )
    return _S3Loader(extra_search_paths=extra)


def make_client(
    *, endpoint_url: str | None, region: str | None, timeout: Timeouts, max_concurrency: int,
    addressing_style: str, request_checksums: str, where: str,
) -> Any:  # fmt: skip
    """A botocore S3 client that never retries on its own: S3Mailbox retries, with its policy and counts."""
    options: dict[str, Any] = dict(
        connect_timeout=timeout.connect,
        read_timeout=timeout.read,
        max_pool_connections=max_concurrency,
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": addressing_style},
        request_checksum_calculation=request_checksums,
        response_checksum_validation=request_checksums,
    )
    try:
        config = Config(**options)
    except TypeError:  # botocore before 1.36 has neither option, and sends no trailing checksums anyway
        del options["request_checksum_calculation"], options["response_checksum_validation"]
        config = Config(**options)
    # A session per mailbox (botocore sessions are not thread-safe), sharing one loader of the service
    # description, which is what makes a first client slow (~0.15 s of CPU; a second one takes 0.02 s);
    # client creation is serialised anyway.
    with _LOADER_LOCK:
        global _LOADER
        _LOADER = _LOADER or _new_loader()
        session = botocore.session.Session()
        session.register_component("data_loader", _LOADER)
        try:
            return session.create_client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
        except (ValueError, BotoCoreError) as error:
            raise ConfigError(
                f"cannot make an S3 client for {where}: {error}; check endpoint_url and region"
            ) from error


class LazyClient:
    """A mailbox's client: begun on a thread of its own as the mailbox is made, so that botocore's ~0.15 s of
    CPU (more on a busy machine) overlaps what the caller does before the first request (building the
    model, ...); calling it returns the client, waiting for that thread or making it if the thread failed
    (then the error is raised in the caller's thread). A copy of the mailbox forked into another process
    makes a client of its own: connections are not shared across processes."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make, self._client, self._lock, self._pid = make, None, threading.Lock(), os.getpid()
        threading.Thread(target=self._warm, name="slowlink-s3-client", daemon=True).start()

    def _warm(self) -> None:
        try:
            self()
        except Exception:  # the first request makes it again, and raises the error where it is seen
            pass

    def __call__(self) -> Any:
        if self._pid != os.getpid():
            self._client, self._lock, self._pid = None, threading.Lock(), os.getpid()
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make()
        return self._client
