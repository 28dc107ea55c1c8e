"""What an S3 store's answers mean, for S3Mailbox: which failures are transient and worth a retry,
which are refusals for the verb to interpret, and what the Date headers say of the store's clock.
"""

from __future__ import annotations

import threading
import time
from email.utils import parsedate_to_datetime
from typing import Any

from botocore.exceptions import (
    ClientError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

THROTTLING = {"SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "RequestLimitExceeded"}
# RequestTimeout is a 400 on S3 but means "your upload stalled": as transient as a 503.
# ConditionalRequestConflict (409): a concurrent conditional write on the same key; AWS says retry.
TRANSIENT_CODES = THROTTLING | {"RequestTimeout", "InternalError", "ServiceUnavailable"}
TRANSIENT_CODES.add("ConditionalRequestConflict")
DENIED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}
DENIED_CODES.add("InvalidToken")
# Failures where the request may never have reached the store, or its answer was lost on the way back.
NETWORK_ERRORS = (BotoConnectionError, HTTPClientError, IncompleteReadError, FlexibleChecksumError)


class Refused(Exception):
    """A non-transient answer from the store, for the verb to interpret (412, 304, 404) or reject."""

    def __init__(self, error: ClientError, tries: int) -> None:
        super().__init__(str(error))
        self.error, self.tries = error, tries
        self.code = error_code(error)
        self.status = error_status(error)


def error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def error_status(error: ClientError) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def is_transient(error: ClientError) -> bool:
    status = error_status(error)
    # 501 Not Implemented is permanent: the store lacks the feature, and asking again will not add it.
    return error_code(error) in TRANSIENT_CODES or status == 429 or (status >= 500 and status != 501)


def describe(error: Exception | None) -> str:
    if isinstance(error, ClientError):  # its own text adds a misleading "reached max retries: 0"
        message = error.response.get("Error", {}).get("Message", "")
        return f"HTTP {error_status(error)} {error_code(error)} {message}".rstrip()
    return str(error)


def strip_etag(etag: str) -> str:
    return etag.strip('"')


def quote_etag(etag: str) -> str:
    return f'"{strip_etag(etag)}"'


class StoreClock:
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


def delete_objects(client: Any, request: dict) -> dict:
    """DeleteObjects, with per-key failures raised as the ClientError of the first one (absent keys are fine)."""
    answer = client.delete_objects(**request)
    errors = [e for e in answer.get("Errors", []) if e.get("Code") != "NoSuchKey"]
    if errors:
        # Deleting again is harmless, so a transient per-key failure retries the whole batch.
        first = errors[0]
        status = 503 if first.get("Code") in TRANSIENT_CODES else 400
        if first.get("Code") in DENIED_CODES:
            status = 403
        raise ClientError(
            {"Error": dict(first), "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}}},
            "DeleteObjects",
        )
    return answer
