"""A mailbox in an S3 bucket (AWS S3, MinIO, Cloudflare R2, Hugging Face Storage Buckets) through boto3.

Create-once is PutObject with `If-None-Match: *`, compare-and-swap PutObject with `If-Match`; a put over
`multipart_threshold` goes up in parts (s3_multipart.py). Transient failures (throttling, 5xx, timeouts,
dropped connections) are retried with capped exponential backoff and full jitter; anything else raises at
once. Which store needs which options: docs/stores.md.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

from ..errors import ConfigError, MailboxRejected, MailboxUnavailable, ObjectTooLarge, PreconditionFailed
from .contract import Listing, Object, check_key, is_key, join_key
from .ignored import IgnoredHook, IgnoredKeys, warn_ignored
from .limits import read_capped, resolve_limit
from .s3_answers import (
    DENIED_CODES,
    NETWORK_ERRORS,
    Refused,
    StoreClock,
    delete_objects,
    describe,
    error_code,
    is_transient,
    quote_etag,
    strip_etag,
)
from .s3_multipart import MultipartUpload, ViewBody, check_put_size
from .s3_options import (
    CHECKSUM_MODES,
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_SIZE,
    LazyClient,
    Retries,
    Timeouts,
    check_client_options,
    make_client,
)

log = logging.getLogger(__name__)

# CHECKSUM_MODES, Retries, Timeouts: from s3_options
__all__ = ["CHECKSUM_MODES", "Retries", "S3Mailbox", "Timeouts"]

DELETE_BATCH = 1000  # DeleteObjects takes at most this many keys per request
_RETRIES, _TIMEOUTS = Retries(), Timeouts()  # the defaults (frozen values)


def _checked_prefix(bucket: str, prefix: str) -> str:
    """`prefix` without its outer '/'s, once `bucket` is a bucket name and `prefix` is a key or ''."""
    if not isinstance(bucket, str) or not bucket or any(c.isspace() or c == "/" for c in bucket):
        raise ConfigError(f"S3Mailbox bucket {bucket!r} is not a bucket name; pass one like 'my-training'")
    stripped = prefix.strip("/")
    if stripped:
        try:
            check_key(stripped)
        except ConfigError:
            raise ConfigError(
                f"S3Mailbox prefix {prefix!r} is not allowed: use '/'-separated parts of letters, digits, "
                "'.', '_' and '-', e.g. 'runs/run-1'"
            ) from None
    return stripped


class S3Mailbox:
    """The storage contract over one bucket; keys are relative to `prefix`. Safe to share between threads.

    `requests` counts HTTP requests per verb (retries included) and `retried` the retries among them;
    `bytes_sent` and `bytes_received` count object bytes (retried uploads included), for benchmarks
    and cost estimates. `on_ignored(key, reason)` hears once of each listed key that slowlink could not
    have written (a space, '..', a trailing '/'), which `list` leaves out; by default a logged warning.
    A put of more than `multipart_threshold` bytes goes up in parts of `part_size` bytes (the last one
    shorter), except a compare-and-swap, which is always one PutObject. Its botocore client is made on a
    thread of its own as the mailbox is made: made before the model, it is ready when the Session joins.
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
        retries: Retries | int = _RETRIES,
        timeout: Timeouts | float = _TIMEOUTS,
        addressing_style: str | None = None,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        part_size: int = DEFAULT_PART_SIZE,
    ) -> None:
        self._arguments = {name: value for name, value in locals().items() if name != "self"}  # for copies
        self.prefix = _checked_prefix(bucket, prefix)
        check_client_options(
            endpoint_url=endpoint_url, request_checksums=request_checksums,
            max_concurrency=max_concurrency, addressing_style=addressing_style,
            multipart_threshold=multipart_threshold, part_size=part_size,
        )  # fmt: skip
        self.bucket, self.endpoint_url, self.region = bucket, endpoint_url, region
        self.request_checksums, self.max_concurrency = request_checksums, max_concurrency
        self.multipart_threshold, self.part_size = multipart_threshold, part_size
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
        self._clock = StoreClock()
        self._rng = random.Random()
        self.on_ignored: IgnoredHook = warn_ignored
        self._ignored = IgnoredKeys()
        self._client = LazyClient(lambda: make_client(
            endpoint_url=endpoint_url, region=region, timeout=self.timeout, max_concurrency=max_concurrency,
            addressing_style=self.addressing_style, request_checksums=request_checksums, where=self._where(),
        ))  # fmt: skip

    # -- plumbing ----------------------------------------------------------------------------------

    def _where(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    def _request(self, verb: str, key: str, call: Callable[[Any], dict]) -> dict:
        """Run `call(client)` until it succeeds, retrying transient failures; raise Refused for the rest."""
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
                if not is_transient(error):
                    raise Refused(error, attempt) from error
                last = error
            except (NoCredentialsError, PartialCredentialsError) as error:
                raise MailboxRejected(
                    f"no usable S3 credentials for {self._where()}: {error}; set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment, see docs/stores.md"
                ) from error
            except NETWORK_ERRORS as error:
                last = error
            else:
                headers = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {})
                self._clock.observe(headers, sent, time.time())
                return answer
        raise MailboxUnavailable(
            f"{verb} {key} in {self._where()} failed {self.retries.attempts} times; last error: {describe(last)}. "
            "The store is throttling, failing or unreachable; check the endpoint and network, "
            "or allow more with S3Mailbox(retries=Retries(attempts=...))"
        ) from last

    def _rejected(self, refused: Refused, verb: str, key: str) -> MailboxRejected:
        if refused.status == 403 or refused.code in DENIED_CODES:
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

    def _count_sent(self, size: int) -> None:
        with self._stats_lock:
            self.bytes_sent += size

    # -- the five verbs ----------------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        if if_absent and if_match is not None:
            raise ConfigError(
                f"put({key!r}) got both if_absent and if_match; a key cannot be absent and match"
            )
        view = memoryview(data).cast("B")  # any contiguous bytes-like; len() of a view counts its bytes
        single = if_match is not None or len(view) <= self.multipart_threshold
        # Before any request: a put the store cannot take fails now, not after gigabytes were sent.
        check_put_size(key, len(view), single=single, part_size=self.part_size, where=self._where())
        if not single:
            return MultipartUpload(self, key, view, if_absent=if_absent).run()
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key)}
        if if_absent:
            params["IfNoneMatch"] = "*"
        if if_match is not None:
            params["IfMatch"] = quote_etag(if_match)

        def call(client: Any) -> dict:
            self._count_sent(len(view))
            # Bytes as they are; any other bytes-like read in place (boto3 takes no memoryview), not copied.
            return client.put_object(Body=data if isinstance(data, bytes) else ViewBody(view), **params)

        try:
            answer = self._request("PUT", key, call)
        except Refused as refused:
            raise self._put_refused(refused, key, if_match) from None
        except MailboxUnavailable as error:
            if (
                isinstance(error.__cause__, ClientError)
                and error_code(error.__cause__) == "ConditionalRequestConflict"
            ):
                self._settle_conflict(key, if_absent, if_match)
            raise
        etag = answer.get("ETag")
        if not etag:  # some gateways leave it out; the contract promises one
            head = self._head(key)
            etag = head["ETag"] if head else ""
        return strip_etag(etag)

    def _put_refused(self, refused: Refused, key: str, if_match: str | None, verb: str = "PUT") -> Exception:
        # A retried conditional write may find its own earlier, answered-but-lost attempt.
        maybe_ours = " (an earlier try of this request may have written it; read the key to tell)" * (
            refused.tries > 1
        )
        if refused.status == 412:
            what = f"{key} already exists" if if_match is None else f"{key} changed since etag {if_match}"
            return PreconditionFailed(what + maybe_ours)
        if if_match is not None and refused.status == 404 and refused.code != "NoSuchBucket":
            return PreconditionFailed(f"{key} does not exist, so it cannot match etag {if_match}{maybe_ours}")
        return self._rejected(refused, verb, key)

    def _settle_conflict(self, key: str, if_absent: bool, if_match: str | None) -> None:
        """After 409s to the last try, one HEAD tells whether another writer won (PreconditionFailed)."""
        head = self._head(key)
        if if_absent and head is not None:
            raise PreconditionFailed(f"{key} already exists (a concurrent create of it won)")
        if if_match is not None and (head is None or strip_etag(head["ETag"]) != strip_etag(if_match)):
            raise PreconditionFailed(f"{key} changed since etag {if_match} (a concurrent write of it won)")

    def _head(self, key: str) -> dict | None:
        params = {"Bucket": self.bucket, "Key": self._full(key)}
        try:
            return self._request("HEAD", key, lambda client: client.head_object(**params))
        except Refused as refused:
            if refused.status == 404 and refused.code != "NoSuchBucket":
                return None
            raise self._rejected(refused, "HEAD", key) from None

    def get(
        self, key: str, *, if_none_match: str | None = None, max_bytes: int | None = None
    ) -> Object | None:
        params = {"Bucket": self.bucket, "Key": self._full(key)}
        limit = resolve_limit(max_bytes)
        if if_none_match is not None:
            params["IfNoneMatch"] = quote_etag(if_none_match)

        def call(client: Any) -> dict:
            answer = client.get_object(**params)
            # Read inside the try: a stream cut halfway is a network error and is retried whole.
            answer["Body"] = self._read_body(key, answer, limit)
            return answer

        try:
            answer = self._request("GET", key, call)
        except Refused as refused:
            if refused.status == 304:
                return Object(None, strip_etag(if_none_match or ""))
            if refused.status == 404 and refused.code != "NoSuchBucket":
                return None
            raise self._rejected(refused, "GET", key) from None
        return Object(answer["Body"], strip_etag(answer.get("ETag") or ""))

    def _read_body(self, key: str, answer: dict, limit: int) -> bytes:
        """The object's bytes: refused unread when its stated length is over `limit`, and cut off one
        byte past the limit whatever that length said (a chunked answer states none)."""
        body, stated = answer["Body"], answer.get("ContentLength")
        stated = stated if isinstance(stated, int) and stated >= 0 else None
        received = 0

        def read(size: int) -> bytes:
            nonlocal received
            chunk = body.read(size)
            received += len(chunk)
            return chunk

        try:
            if stated is not None and stated > limit:
                raise ObjectTooLarge(key, stated, limit, self._where())
            return read_capped(read, expected=stated or 0, limit=limit, key=key, where=self._where())
        except ObjectTooLarge:
            body.close()  # hang up rather than drain the rest
            raise
        finally:
            with self._stats_lock:
                self.bytes_received += received

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
            except Refused as refused:
                raise self._rejected(refused, "LIST", prefix) from None
            for item in page.get("Contents", []):
                key = self._listed_key(item["Key"], base, prefix)
                # Filter here too: Hugging Face's gateway ignores StartAfter.
                if key is not None and (after is None or key.encode() > after):
                    found.append(Listing(key, strip_etag(item["ETag"]), int(item["Size"])))
            if not page.get("IsTruncated"):
                break
            if not page.get("NextContinuationToken"):
                raise MailboxRejected(f"LIST {prefix} in {self._where()}: a truncated page without a token")
            params["ContinuationToken"] = page["NextContinuationToken"]
        return sorted(found, key=lambda listing: listing.key.encode())

    def _listed_key(self, full: str, base: int, prefix: str) -> str | None:
        """The key of a listed object relative to the mailbox's prefix, None for one to leave out."""
        if self.prefix and not full.startswith(self.prefix + "/"):
            self._ignored.report(self.on_ignored, full, f"outside the mailbox's prefix {self.prefix!r}")
            return None
        key = full[base:]
        if not key.startswith(prefix):
            return None
        if not is_key(key):
            reason = "a key slowlink never writes (keys are '/'-separated letters, digits, '.', '_' and '-')"
            self._ignored.report(self.on_ignored, key, reason)
            return None
        return key

    def delete(self, keys: list[str]) -> None:
        full = [self._full(key) for key in keys]
        for start in range(0, len(full), DELETE_BATCH):
            batch = full[start : start + DELETE_BATCH]
            request = {
                "Bucket": self.bucket,
                "Delete": {"Objects": [{"Key": k} for k in batch], "Quiet": True},
            }
            try:
                self._request("DELETE", batch[0], lambda client, r=request: delete_objects(client, r))
            except Refused as refused:
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
