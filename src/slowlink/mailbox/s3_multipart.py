"""Large puts for S3Mailbox: the size rule every put passes before its first request, and the multipart
upload a put over `multipart_threshold` becomes. Parts are sent from views of the caller's bytes, each
retried on its own, so a 10 GB payload is never copied whole and a failed part costs one part again.
"""

from __future__ import annotations

import hashlib
import io
import logging
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ..errors import ConfigError, MailboxError, MailboxUnavailable, PreconditionFailed
from .s3_answers import Refused, error_code, strip_etag
from .s3_options import MAX_OBJECT_BYTES, MAX_PARTS, MAX_SINGLE_PUT_BYTES

if TYPE_CHECKING:
    from .s3 import S3Mailbox

log = logging.getLogger(__name__)


def check_put_size(key: str, size: int, *, single: bool, part_size: int, where: str) -> None:
    """Raise ConfigError, naming the size, the limit and the fix, for a put the store could not take.

    `single`: the put goes as one PutObject (at most 5 GiB); otherwise as up to 10,000 parts of
    `part_size` bytes, and at most 5 TiB. Writes are not capped by what a `get` accepts by default
    (limits.DEFAULT_MAX_BYTES): every reader names its own `max_bytes` for what it reads (a payload's is
    about twice its fragment's float32 bytes), and that default is only a backstop for unsized reads.
    """
    if single:
        if size > MAX_SINGLE_PUT_BYTES:
            raise ConfigError(
                f"put({key!r}) of {size} bytes to {where} is over the {MAX_SINGLE_PUT_BYTES}-byte (5 GiB) "
                "limit of one PutObject, which is how every compare-and-swap (if_match) write goes; write "
                "it without if_match, so that it goes up in parts, or make it smaller"
            )
        return
    limit = min(MAX_OBJECT_BYTES, MAX_PARTS * part_size)
    if size > limit:
        fix = (
            "5 TiB is S3's largest object: split the payload (more fragments in the plan)"
            if size > MAX_OBJECT_BYTES
            else f"pass S3Mailbox(part_size=...) of at least {-(-size // MAX_PARTS)} bytes"
        )
        raise ConfigError(
            f"put({key!r}) of {size} bytes to {where} is over the {limit}-byte limit of a multipart upload "
            f"({MAX_PARTS} parts of part_size={part_size} bytes, at most 5 TiB); {fix}"
        )


class ViewBody(io.RawIOBase):
    """A read-only, seekable file over a memoryview: a Body as botocore takes it (it refuses a bare
    memoryview). Each read copies only what it asks for: botocore reads 1 MiB at a time to checksum the
    body, the connection its block size to send it, seeking back to the start in between."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view, self._at = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: len(self._view)}[whence]
        self._at = max(0, base + offset)
        return self._at

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._at + size)
        chunk = bytes(self._view[self._at : end])
        self._at = max(self._at, end)
        return chunk

    def readinto(self, buffer: Any) -> int:
        chunk = self.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


class MultipartUpload:
    """One put as a multipart upload: create it, send each part (retried on its own by the mailbox's
    policy), complete it; when a step finally fails, abort it as far as the store lets us.

    Requests are counted as UPLOAD (create), PART, COMPLETE and ABORT. Create-once (`if_absent`) sends
    If-None-Match on the complete, which AWS (since August 2024) and moto honour, so exactly one racer
    wins; compare-and-swap never comes here (S3Mailbox.put sends it as one PutObject): moto ignores
    If-Match on a complete, so it could not be tested, and every if_match write slowlink makes is a
    small record.
    """

    def __init__(self, mailbox: S3Mailbox, key: str, view: memoryview, *, if_absent: bool) -> None:
        self.mailbox, self.key, self.view, self.if_absent = mailbox, key, view, if_absent
        self.part_size = mailbox.part_size
        self.count = -(-len(view) // self.part_size)
        self.base = {"Bucket": mailbox.bucket, "Key": mailbox._full(key)}
        # As boto3's own transfers do: with "when_supported" each part carries a CRC32, computed as it is
        # read, which the store checks on arrival and the complete lists again.
        self.checksum = mailbox.request_checksums == "when_supported"
        self.upload_id = ""

    def run(self) -> str:
        """Upload every part and return the object's etag (S3's is "<md5 of the parts' md5s>-<count>")."""
        if self.if_absent and self.mailbox._head(self.key) is not None:
            # Before any part: an existing key fails create-once without its bytes being sent at all.
            raise PreconditionFailed(f"{self.key} already exists")
        self.upload_id = self._create()
        try:
            parts = [self._send_part(number) for number in range(1, self.count + 1)]
            return self._complete(parts)
        except BaseException:
            self._abort()  # also on KeyboardInterrupt: stored parts are billed until aborted
            raise

    def _create(self) -> str:
        params = dict(self.base, ChecksumAlgorithm="CRC32") if self.checksum else dict(self.base)
        # A retried create whose first answer was lost leaves that upload behind, empty: no part is billed.
        try:
            answer = self.mailbox._request(
                "UPLOAD", self.key, lambda client: client.create_multipart_upload(**params)
            )
        except Refused as refused:
            raise self.mailbox._rejected(refused, "UPLOAD", self.key) from None
        return answer["UploadId"]

    def _send_part(self, number: int) -> dict[str, Any]:
        start = (number - 1) * self.part_size
        piece = self.view[start : start + self.part_size]  # a view: the caller's bytes, not a copy
        params: dict[str, Any] = {**self.base, "UploadId": self.upload_id, "PartNumber": number}
        if self.checksum:
            params["ChecksumAlgorithm"] = "CRC32"

        def call(client: Any) -> dict:
            self.mailbox._count_sent(len(piece))
            return client.upload_part(Body=ViewBody(piece), **params)

        what = f"{self.key} part {number} of {self.count}"
        try:
            answer = self.mailbox._request("PART", what, call)
        except Refused as refused:
            raise self.mailbox._rejected(refused, "PART", what) from None
        part = {"PartNumber": number, "ETag": answer["ETag"]}
        if answer.get("ChecksumCRC32"):
            part["ChecksumCRC32"] = answer["ChecksumCRC32"]
        return part

    def _complete(self, parts: list[dict[str, Any]]) -> str:
        params: dict[str, Any] = {
            **self.base,
            "UploadId": self.upload_id,
            "MultipartUpload": {"Parts": parts},
        }
        if self.if_absent:
            params["IfNoneMatch"] = "*"
        try:
            answer = self.mailbox._request(
                "COMPLETE", self.key, lambda client: client.complete_multipart_upload(**params)
            )
        except Refused as refused:
            # A retried complete may meet its own earlier try, applied with its answer lost: the upload is
            # gone (404 NoSuchUpload) or, for create-once, the key exists (412). The etag tells if it's ours.
            if refused.tries > 1 and refused.status in (404, 412) and refused.code != "NoSuchBucket":
                etag = self._ours(parts)
                if etag is not None:
                    return etag
            raise self.mailbox._put_refused(refused, self.key, None, verb="COMPLETE") from None
        except MailboxUnavailable as error:
            if (
                isinstance(error.__cause__, ClientError)
                and error_code(error.__cause__) == "ConditionalRequestConflict"
            ):
                self.mailbox._settle_conflict(self.key, self.if_absent, None)
            raise
        etag = answer.get("ETag")
        if not etag:  # some gateways leave it out; the contract promises one
            head = self.mailbox._head(self.key)
            etag = head["ETag"] if head else ""
        return strip_etag(etag)

    def _ours(self, parts: list[dict[str, Any]]) -> str | None:
        """The key's etag if it is the object these parts make, else None (also when that cannot be told:
        a store whose part etags are not MD5s, as with SSE-KMS, makes no claimable multipart etag)."""
        try:
            digests = b"".join(bytes.fromhex(strip_etag(part["ETag"])) for part in parts)
        except ValueError:
            return None
        expected = f"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(parts)}"
        head = self.mailbox._head(self.key)
        return expected if head is not None and strip_etag(head.get("ETag", "")) == expected else None

    def _abort(self) -> None:
        params = {**self.base, "UploadId": self.upload_id}
        try:
            self.mailbox._request("ABORT", self.key, lambda client: client.abort_multipart_upload(**params))
        except Refused as refused:
            if refused.status != 404:  # 404 NoSuchUpload: nothing is left to abort
                self._abort_failed(refused)
        except MailboxError as error:
            self._abort_failed(error)

    def _abort_failed(self, error: Exception) -> None:
        log.warning(
            "could not abort multipart upload %s of %s in %s (%s); its parts stay stored, and billed, until "
            "it is aborted: a bucket lifecycle rule with AbortIncompleteMultipartUpload does it for you",
            self.upload_id, self.key, self.mailbox._where(), error,
        )  # fmt: skip
