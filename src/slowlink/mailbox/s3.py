"""A mailbox in an S3 bucket (AWS S3, MinIO, Cloudflare R2, Hugging Face Storage Buckets) through boto3.

Create-once is PutObject with `If-None-Match: *`, compare-and-swap PutObject with `If-Match`. Transient
failures (throttling, 5xx, timeouts, dropped connections) are retried with capped exponential backoff and
full jitter; anything else raises at once. Which store needs which options: docs/stores.md.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import botocore.loaders
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from ..errors import ConfigError, MailboxRejected, MailboxUnavailable, PreconditionFailed
from .contract import Listing, Object, check_key, join_key

log = logging.getLogger(__name__)

CHECKSUM_MODES = ("when_supported", "when_required")
DELETE_BATCH = 1000  # DeleteObjects takes at most this many keys per request
_THROTTLING = {"SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "RequestLimitExceeded"}
# RequestTimeout is a 400 on S3 but means "your upload stalled": as transient as a 503.
# ConditionalRequestConflict (409): a concurrent conditional write on the same key; AWS says retry.
_TRANSIENT_CODES = _THROTTLING | {"RequestTimeout", "InternalError", "ServiceUnavailable"}
_TRANSIENT_CODES.add("ConditionalRequestConflict")
_DENIED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}
_DENIED_CODES.add("InvalidToken")
# Failures where the request may never have reached the store, or its answer was lost on the way back.
_NETWORK_ERRORS = (BotoConnectionError, HTTPClientError, IncompleteReadError, FlexibleChecksumError)
_LOADER: botocore.loaders.Loader | None = None  # shared by all mailboxes' clients, see _make_client
_LOADER_LOCK = threading.Lock()


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


class _Refused(Exception):
    """A non-transient answer from the store, for the verb to interpret (412, 304, 404) or reject."""

    def __init__(self, error: ClientError, tries: int) -> None:
        super().__init__(str(error))
        self.error, self.tries = error, tries
        self.code = _code(error)
        self.status = _status(error)


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _status(error: ClientError) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _is_transient(error: ClientError) -> bool:
    status = _status(error)
    # 501 Not Implemented is permanent: the store lacks the feature, and asking again will not add it.
    return _code(error) in _TRANSIENT_CODES or status == 429 or (status >= 500 and status != 501)


def _describe(error: Exception | None) -> str:
    if isinstance(error, ClientError):  # its own text adds a misleading "reached max retries: 0"
        message = error.response.get("Error", {}).get("Message", "")
        return f"HTTP {_status(error)} {_code(error)} {message}".rstrip()
    return str(error)


def _strip(etag: str) -> str:
    return etag.strip('"')


def _quote(etag: str) -> str:
    return f'"{_strip(etag)}"'


class _StoreClock:
    """The store's time, estimated from the Date headers of its answers.

    An answer sent between local times t0 and t1 and dated D (whole seconds) bounds the offset
    store − local to [D − t1, D + 1 − t0]. Intersecting those intervals narrows the estimate well below
    the header's one-second resolution; a sample that contradicts them (a clock was stepped) restarts it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._low: float | None = None
        self._high = 0.0

    def observe(self, headers: dict[str, str], sent: float, received: float) -> None:
        try:
            dated = parsedate_to_datetime(headers["date"]).timestamp()
        except (KeyError, TypeError, ValueError):
            return
        low, high = dated - received, dated + 1.0 - sent
        with self._lock:
            if self._low is None or low > self._high or high < self._low:
                self._low, self._high = low, high
            else:
                self._low, self._high = max(self._low, low), min(self._high, high)

    def now(self) -> float:
        with self._lock:
            offset = 0.0 if self._low is None else (self._low + self._high) / 2
        return time.time() + offset


class S3Mailbox:
    """The storage contract over one bucket; keys are relative to `prefix`. Safe to share between threads.

    `requests` counts HTTP requests per verb (retries included) and `retried` the retries among them;
    `bytes_sent` and `bytes_received` count object bytes (retried uploads included), for benchmarks
    and cost estimates.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        request_checksums: str = "when_supported",
        max_concurrency: int = 8,
        retries: Retries | int = Retries(),
        timeout: Timeouts | float = Timeouts(),
        addressing_style: str | None = None,
    ) -> None:
        self._arguments = {name: value for name, value in locals().items() if name != "self"}  # for copies
        if not isinstance(bucket, str) or not bucket or any(c.isspace() or c == "/" for c in bucket):
            raise ConfigError(
                f"S3Mailbox bucket {bucket!r} is not a bucket name; pass one like 'my-training'"
            )
        self.prefix = prefix.strip("/")
        if self.prefix:
            try:
                check_key(self.prefix)
            except ConfigError:
                raise ConfigError(
                    f"S3Mailbox prefix {prefix!r} is not allowed: use '/'-separated parts of letters, digits, "
                    "'.', '_' and '-', e.g. 'runs/run-1'"
                ) from None
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
        self.bucket, self.endpoint_url, self.region = bucket, endpoint_url, region
        self.request_checksums, self.max_concurrency = request_checksums, max_concurrency
        self.retries = Retries(attempts=retries) if isinstance(retries, int) else retries
        self.timeout = (
            Timeouts(connect=timeout, read=timeout) if isinstance(timeout, (int, float)) else timeout
        )
        # S3-compatible stores all take path-style addressing; AWS itself prefers virtual hosts.
        self.addressing_style = addressing_style or ("path" if endpoint_url else "auto")
        self.requests: Counter[str] = Counter()
        self.retried: Counter[str] = Counter()
        self.bytes_sent = 0
        self.bytes_received = 0
        self._stats_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._client_lock = threading.Lock()
        self._s3: Any = None
        self._clock = _StoreClock()
        self._rng = random.Random()

    # -- plumbing ----------------------------------------------------------------------------------

    def _client(self) -> Any:
        if self._s3 is None:
            with self._client_lock:
                if self._s3 is None:
                    self._s3 = self._make_client()
        return self._s3

    def _make_client(self) -> Any:
        options: dict[str, Any] = dict(
            connect_timeout=self.timeout.connect,
            read_timeout=self.timeout.read,
            max_pool_connections=self.max_concurrency,
            retries={"total_max_attempts": 1, "mode": "standard"},  # we retry, with our own policy and counts
            s3={"addressing_style": self.addressing_style},
            request_checksum_calculation=self.request_checksums,
            response_checksum_validation=self.request_checksums,
        )
        try:
            config = Config(**options)
        except TypeError:  # botocore before 1.36 has neither option, and sends no trailing checksums anyway
            del options["request_checksum_calculation"], options["response_checksum_validation"]
            config = Config(**options)
        # A session per mailbox (botocore sessions are not thread-safe), sharing one loader of the service
        # description, which is what makes a new client slow (~0.1 s); client creation is serialised anyway.
        with _LOADER_LOCK:
            global _LOADER
            _LOADER = _LOADER or botocore.loaders.create_loader()
            session = botocore.session.Session()
            session.register_component("data_loader", _LOADER)
            try:
                return session.create_client(
                    "s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config
                )
            except (ValueError, BotoCoreError) as error:
                raise ConfigError(
                    f"cannot make an S3 client for {self._where()}: {error}; check endpoint_url and region"
                ) from error

    def _where(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    def _request(self, verb: str, key: str, call: Callable[[Any], dict]) -> dict:
        """Run `call(client)` until it succeeds, retrying transient failures; raise _Refused for the rest."""
        client = self._client()
        last: Exception | None = None
        for attempt in range(1, self.retries.attempts + 1):
            if attempt > 1:
                with self._stats_lock:
                    self.retried[verb] += 1
                delay = self.retries.backoff(attempt - 1, self._rng)
                log.debug("retrying %s %s in %.2f s after %r", verb, key, delay, last)
                time.sleep(delay)
            sent = time.time()
            try:
                with self._slots:
                    with self._stats_lock:
                        self.requests[verb] += 1
                    answer = call(client)
            except ClientError as error:
                headers = error.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
                self._clock.observe(headers, sent, time.time())
                if not _is_transient(error):
                    raise _Refused(error, attempt) from error
                last = error
            except (NoCredentialsError, PartialCredentialsError) as error:
                raise MailboxRejected(
                    f"no usable S3 credentials for {self._where()}: {error}; set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment, see docs/stores.md"
                ) from error
            except _NETWORK_ERRORS as error:
                last = error
            else:
                headers = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {})
                self._clock.observe(headers, sent, time.time())
                return answer
        raise MailboxUnavailable(
            f"{verb} {key} in {self._where()} failed {self.retries.attempts} times; last error: {_describe(last)}. "
            "The store is throttling, failing or unreachable; check the endpoint and network, "
            "or allow more with S3Mailbox(retries=Retries(attempts=...))"
        ) from last

    def _rejected(self, refused: _Refused, verb: str, key: str) -> MailboxRejected:
        if refused.status == 403 or refused.code in _DENIED_CODES:
            return MailboxRejected(
                f"no permission for bucket {self.bucket!r} at prefix {self.prefix!r} ({verb} {key}: "
                f"{refused.code or refused.status}); check credentials and the bucket's policy"
            )
        if refused.code == "NoSuchBucket":
            return MailboxRejected(
                f"bucket {self.bucket!r} does not exist"
                + (f" at {self.endpoint_url}" if self.endpoint_url else "")
                + "; create it or fix the name"
            )
        return MailboxRejected(f"{verb} {key} in {self._where()} was refused: {refused.error}")

    def _full(self, key: str) -> str:
        return join_key(self.prefix, check_key(key))

    # -- the five verbs ----------------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        if if_absent and if_match is not None:
            raise ConfigError(
                f"put({key!r}) got both if_absent and if_match; a key cannot be absent and match"
            )
        data = bytes(data)
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key), "Body": data}
        if if_absent:
            params["IfNoneMatch"] = "*"
        if if_match is not None:
            params["IfMatch"] = _quote(if_match)

        def call(client: Any) -> dict:
            with self._stats_lock:
                self.bytes_sent += len(data)
            return client.put_object(**params)

        try:
            answer = self._request("PUT", key, call)
        except _Refused as refused:
            raise self._put_refused(refused, key, if_match) from None
        except MailboxUnavailable as error:
            if (
                isinstance(error.__cause__, ClientError)
                and _code(error.__cause__) == "ConditionalRequestConflict"
            ):
                self._settle_conflict(key, if_absent, if_match)
            raise
        etag = answer.get("ETag")
        if not etag:  # some gateways leave it out; the contract promises one
            head = self._head(key)
            etag = head["ETag"] if head else ""
        return _strip(etag)

    def _put_refused(self, refused: _Refused, key: str, if_match: str | None) -> Exception:
        # A retried conditional write may find its own earlier, answered-but-lost attempt.
        maybe_ours = " (an earlier try of this request may have written it; read the key to tell)" * (
            refused.tries > 1
        )
        if refused.status == 412:
            what = f"{key} already exists" if if_match is None else f"{key} changed since etag {if_match}"
            return PreconditionFailed(what + maybe_ours)
        if if_match is not None and refused.status == 404 and refused.code != "NoSuchBucket":
            return PreconditionFailed(f"{key} does not exist, so it cannot match etag {if_match}{maybe_ours}")
        return self._rejected(refused, "PUT", key)

    def _settle_conflict(self, key: str, if_absent: bool, if_match: str | None) -> None:
        """After 409s to the last try, one HEAD tells whether another writer won (PreconditionFailed)."""
        head = self._head(key)
        if if_absent and head is not None:
            raise PreconditionFailed(f"{key} already exists (a concurrent create of it won)")
        if if_match is not None and (head is None or _strip(head["ETag"]) != _strip(if_match)):
            raise PreconditionFailed(f"{key} changed since etag {if_match} (a concurrent write of it won)")

    def _head(self, key: str) -> dict | None:
        params = {"Bucket": self.bucket, "Key": self._full(key)}
        try:
            return self._request("HEAD", key, lambda client: client.head_object(**params))
        except _Refused as refused:
            if refused.status == 404 and refused.code != "NoSuchBucket":
                return None
            raise self._rejected(refused, "HEAD", key) from None

    def get(self, key: str, *, if_none_match: str | None = None) -> Object | None:
        params = {"Bucket": self.bucket, "Key": self._full(key)}
        if if_none_match is not None:
            params["IfNoneMatch"] = _quote(if_none_match)

        def call(client: Any) -> dict:
            answer = client.get_object(**params)
            # Read inside the try: a stream cut halfway is a network error and is retried whole.
            answer["Body"] = answer["Body"].read()
            with self._stats_lock:
                self.bytes_received += len(answer["Body"])
            return answer

        try:
            answer = self._request("GET", key, call)
        except _Refused as refused:
            if refused.status == 304:
                return Object(None, _strip(if_none_match or ""))
            if refused.status == 404 and refused.code != "NoSuchBucket":
                return None
            raise self._rejected(refused, "GET", key) from None
        return Object(answer["Body"], _strip(answer["ETag"]))

    def list(self, prefix: str, *, start_after: str | None = None) -> list[Listing]:
        base = len(self.prefix) + 1 if self.prefix else 0
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": join_key(self.prefix, prefix)}
        if start_after is not None:
            params["StartAfter"] = join_key(self.prefix, start_after)
        after = None if start_after is None else start_after.encode()
        found = []
        while True:
            try:
                page = self._request(
                    "LIST", prefix, lambda client, p=dict(params): client.list_objects_v2(**p)
                )
            except _Refused as refused:
                raise self._rejected(refused, "LIST", prefix) from None
            for item in page.get("Contents", []):
                key = item["Key"][base:]
                # Filter here too: Hugging Face's gateway ignores StartAfter.
                if key.startswith(prefix) and (after is None or key.encode() > after):
                    found.append(Listing(key, _strip(item["ETag"]), int(item["Size"])))
            if not page.get("IsTruncated"):
                break
            if not page.get("NextContinuationToken"):
                raise MailboxRejected(f"LIST {prefix} in {self._where()}: a truncated page without a token")
            params["ContinuationToken"] = page["NextContinuationToken"]
        return sorted(found, key=lambda listing: listing.key.encode())

    def delete(self, keys: list[str]) -> None:
        full = [self._full(key) for key in keys]
        for start in range(0, len(full), DELETE_BATCH):
            batch = full[start : start + DELETE_BATCH]
            request = {
                "Bucket": self.bucket,
                "Delete": {"Objects": [{"Key": k} for k in batch], "Quiet": True},
            }
            try:
                self._request("DELETE", batch[0], lambda client, r=request: _delete_objects(client, r))
            except _Refused as refused:
                key = refused.error.response.get("Error", {}).get("Key", batch[0])
                raise self._rejected(refused, "DELETE", key) from None

    def clock(self) -> float:
        return self._clock.now()

    def __reduce__(self) -> tuple:
        # A copy for another process gets the configuration, and its own client, locks and counters.
        return _rebuild, (self._arguments,)

    def __repr__(self) -> str:
        endpoint = f", endpoint_url={self.endpoint_url!r}" if self.endpoint_url else ""
        return f"S3Mailbox({self.bucket!r}, {self.prefix!r}{endpoint})"


def _rebuild(arguments: dict) -> S3Mailbox:
    return S3Mailbox(**arguments)


def _delete_objects(client: Any, request: dict) -> dict:
    """DeleteObjects, with per-key failures raised as the ClientError of the first one (absent keys are fine)."""
    answer = client.delete_objects(**request)
    errors = [e for e in answer.get("Errors", []) if e.get("Code") != "NoSuchKey"]
    if errors:
        # Deleting again is harmless, so a transient per-key failure retries the whole batch.
        first = errors[0]
        status = 503 if first.get("Code") in _TRANSIENT_CODES else 400
        if first.get("Code") in _DENIED_CODES:
            status = 403
        raise ClientError(
            {"Error": dict(first), "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}}},
            "DeleteObjects",
        )
    return answer
