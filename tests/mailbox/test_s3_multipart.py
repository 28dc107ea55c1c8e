"""S3Mailbox's multipart uploads against moto's real server: parts, a failed part sent again, aborts, limits.

Faults are real: requests go through a forwarding proxy on 127.0.0.1 in front of moto, which fails the ones a
test picks (or forwards them and drops the answer) and records every request it sees.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import mmap
import os
import pickle
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from slowlink.errors import ConfigError, MailboxRejected, MailboxUnavailable, PreconditionFailed
from slowlink.mailbox.s3 import Retries, S3Mailbox
from tests.s3server import DUMMY_CREDENTIALS

MiB = 1 << 20
PART = 5 * MiB  # S3's smallest part, which moto enforces too
FAST_RETRIES = Retries(attempts=3, first_backoff=0.001, max_backoff=0.002)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    length: int
    headers: frozenset[str]  # the header names, lower-cased
    body: bytes  # kept for requests other than parts

    @property
    def action(self) -> str:
        """The S3 request this is: UPLOAD (create), PART, COMPLETE, ABORT, or the HTTP method."""
        if self.method == "POST" and "uploads" in self.query:
            return "UPLOAD"
        if "uploadId" in self.query:
            return {"PUT": "PART", "POST": "COMPLETE", "DELETE": "ABORT"}.get(self.method, self.method)
        return self.method

    @property
    def part(self) -> int | None:
        return int(self.query["partNumber"][0]) if "partNumber" in self.query else None


# What a fault does to a request: None forwards it; DROP forwards it (the store applies it) and hangs up
# before the answer; the others answer without forwarding: FAIL 503 SlowDown, REFUSE 403, TAKEN 412.
FAIL, DROP, REFUSE, TAKEN = "fail", "drop", "refuse", "taken"
ANSWERS = {FAIL: (503, "SlowDown"), REFUSE: (403, "AccessDenied"), TAKEN: (412, "PreconditionFailed")}
Fault = Callable[[Seen], str | None]


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 that forwards every request to `upstream` unless `fault` says otherwise."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.fault: Fault = lambda seen: None
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def handle_one_request(self) -> None:
                self.raw_requestline = self.rfile.readline(65537)
                if not self.raw_requestline or not self.parse_request():  # answers Expect: 100-continue
                    self.close_connection = True
                    return
                proxy.relay(self)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def actions(self) -> list[str]:
        return [seen.action for seen in self.seen]

    def relay(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        assert "chunked" not in handler.headers.get("Transfer-Encoding", ""), "the proxy reads sized bodies"
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        url = urlsplit(handler.path)
        query = parse_qs(url.query, keep_blank_values=True)
        names = frozenset(name.lower() for name in handler.headers)
        seen = Seen(
            handler.command, url.path, query, len(body), names, b"" if "partNumber" in query else body
        )
        with self._lock:
            self.seen.append(seen)
            fault = self.fault(seen)
        if fault in ANSWERS:
            status, code = ANSWERS[fault]
            reply = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
            handler.send_response(status)
            handler.send_header("Content-Length", str(len(reply)))
            handler.end_headers()
            handler.wfile.write(reply)
            return
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("expect", "connection")}
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=30)
        try:
            connection.request(handler.command, handler.path, body=body, headers=headers)
            answer = connection.getresponse()
            reply = answer.read()
        finally:
            connection.close()
        if fault == DROP:
            handler.close_connection = True  # applied upstream; the client never hears of it
            return
        handler.send_response_only(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                handler.send_header(name, value)
        length = answer.getheader("Content-Length") if handler.command == "HEAD" else None
        handler.send_header("Content-Length", length or str(len(reply)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(reply)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def once(matches: Callable[[Seen], bool], fault: str) -> Fault:
    """A fault that hits the first request `matches` accepts, and no other."""
    hit = False

    def pick(seen: Seen) -> str | None:
        nonlocal hit
        if hit or not matches(seen):
            return None
        hit = True
        return fault

    return pick


@pytest.fixture
def s3(s3_endpoint) -> Iterator[tuple[FaultProxy, Callable[..., S3Mailbox], object]]:
    """A proxy in front of moto, a maker of mailboxes (fresh prefix, 5 MiB parts) through it, and boto3."""
    if not s3_endpoint.is_moto:
        pytest.skip("faults are injected in front of the tests' own moto server")
    import boto3

    proxy = FaultProxy(s3_endpoint.url)
    prefix = f"slowlink-tests/{uuid.uuid4().hex}"
    direct = boto3.session.Session().client(
        "s3", endpoint_url=s3_endpoint.url, region_name=s3_endpoint.region
    )

    def make(**options: object) -> S3Mailbox:
        options = {"multipart_threshold": PART, "part_size": PART, "retries": FAST_RETRIES, **options}
        return S3Mailbox(
            s3_endpoint.bucket, prefix, endpoint_url=proxy.url, region=s3_endpoint.region, **options
        )

    yield proxy, make, direct
    proxy.close()
    listed = direct.list_objects_v2(Bucket=s3_endpoint.bucket, Prefix=prefix).get("Contents", [])
    for item in listed:
        direct.delete_object(Bucket=s3_endpoint.bucket, Key=item["Key"])


def pending_uploads(direct, mailbox: S3Mailbox) -> list[dict]:
    """The multipart uploads begun and neither completed nor aborted under the mailbox's prefix."""
    return direct.list_multipart_uploads(Bucket=mailbox.bucket, Prefix=mailbox.prefix).get("Uploads", [])


def is_part(number: int) -> Callable[[Seen], bool]:
    return lambda seen: seen.action == "PART" and seen.part == number


# -- parts -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("as_view", [False, True], ids=["bytes", "memoryview"])
def test_a_payload_of_several_parts_goes_up_in_parts_and_reads_back_byte_exact(s3, as_view):
    proxy, make, direct = s3
    mailbox = make()
    data = os.urandom(2 * PART + 12345)
    etag = mailbox.put("blobs/big", memoryview(data) if as_view else data)
    assert re.fullmatch(r"[0-9a-f]{32}-3", etag), etag  # S3's etag of a 3-part object
    assert mailbox.get("blobs/big", max_bytes=len(data)).data == data
    assert [(item.key, item.etag, item.size) for item in mailbox.list("blobs/")] == [
        ("blobs/big", etag, len(data))
    ]
    parts = [(seen.part, seen.length) for seen in proxy.seen if seen.action == "PART"]
    assert parts == [(1, PART), (2, PART), (3, 12345)]
    assert mailbox.requests == {"UPLOAD": 1, "PART": 3, "COMPLETE": 1, "GET": 1, "LIST": 1}
    assert mailbox.bytes_sent == len(data)
    assert pending_uploads(direct, mailbox) == []


@pytest.mark.parametrize("size", [1, PART], ids=["one byte", "exactly the threshold"])
def test_a_payload_up_to_the_threshold_goes_as_one_put(s3, size):
    proxy, make, _ = s3
    mailbox = make()
    data = os.urandom(size)
    etag = mailbox.put("blobs/small", data)
    assert "-" not in etag
    assert proxy.actions() == ["PUT"] and mailbox.requests == {"PUT": 1} and mailbox.bytes_sent == size
    assert mailbox.get("blobs/small", max_bytes=size).data == data


def test_one_byte_over_the_threshold_is_a_multipart_upload_with_a_one_byte_last_part(s3):
    proxy, make, _ = s3
    mailbox = make()
    data = os.urandom(PART + 1)
    assert mailbox.put("blobs/edge", data).endswith("-2")
    assert [(seen.part, seen.length) for seen in proxy.seen if seen.action == "PART"] == [(1, PART), (2, 1)]
    assert mailbox.get("blobs/edge", max_bytes=len(data)).data == data


@pytest.mark.parametrize("checksums", ["when_supported", "when_required"])
def test_parts_carry_a_crc32_only_when_checksums_are_supported(s3, checksums):
    proxy, make, _ = s3
    mailbox = make(request_checksums=checksums)
    data = os.urandom(PART + 10)
    mailbox.put("blobs/c", data)
    assert mailbox.get("blobs/c", max_bytes=len(data)).data == data
    sent = {seen.action: seen.headers for seen in proxy.seen}
    supported = checksums == "when_supported"
    assert ("x-amz-checksum-algorithm" in sent["UPLOAD"]) == supported
    assert ("x-amz-checksum-crc32" in sent["PART"]) == supported
    complete = next(seen for seen in proxy.seen if seen.action == "COMPLETE")
    assert complete.body.count(b"<ChecksumCRC32>") == (2 if supported else 0)  # AWS wants them back


# -- a failing part --------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", [FAIL, DROP], ids=["503 once", "answer lost once"])
def test_a_part_that_fails_once_is_sent_again_and_the_upload_completes(s3, fault):
    proxy, make, direct = s3
    mailbox = make()
    proxy.fault = once(is_part(2), fault)
    data = os.urandom(2 * PART + 777)
    etag = mailbox.put("blobs/retried", data)
    assert etag.endswith("-3")
    assert [seen.part for seen in proxy.seen if seen.action == "PART"] == [1, 2, 2, 3]
    assert mailbox.requests == {"UPLOAD": 1, "PART": 4, "COMPLETE": 1} and mailbox.retried == {"PART": 1}
    assert mailbox.bytes_sent == len(data) + PART  # the failed part went twice, nothing else did
    assert mailbox.get("blobs/retried", max_bytes=len(data)).data == data
    assert pending_uploads(direct, mailbox) == []


@pytest.mark.parametrize(
    ("fault", "error", "message"),
    [
        (
            FAIL,
            MailboxUnavailable,
            r"PART blobs/doomed part 2 of 3 in s3://.* failed 3 times; .*503 SlowDown",
        ),
        (
            REFUSE,
            MailboxRejected,
            r"no permission for bucket .* \(PART blobs/doomed part 2 of 3: AccessDenied",
        ),
    ],
    ids=["503 every time", "403"],
)
def test_a_part_that_keeps_failing_aborts_the_upload_and_raises(s3, fault, error, message):
    proxy, make, direct = s3
    mailbox = make()
    proxy.fault = lambda seen: fault if is_part(2)(seen) else None
    with pytest.raises(error, match=message):
        mailbox.put("blobs/doomed", os.urandom(2 * PART + 1))
    tries = 3 if fault == FAIL else 1
    assert proxy.actions() == ["UPLOAD", "PART"] + ["PART"] * tries + ["ABORT"]
    assert pending_uploads(direct, mailbox) == []
    assert mailbox.get("blobs/doomed") is None


def test_an_abort_that_fails_too_is_logged_naming_the_upload_and_the_parts_error_is_raised(s3, caplog):
    proxy, make, direct = s3
    mailbox = make()
    proxy.fault = lambda seen: FAIL if seen.action in ("PART", "ABORT") else None
    with pytest.raises(MailboxUnavailable, match="PART blobs/stuck part 1 of 2"):
        mailbox.put("blobs/stuck", os.urandom(PART + 1))
    [upload] = pending_uploads(direct, mailbox)
    assert mailbox.requests == {"UPLOAD": 1, "PART": 3, "ABORT": 3}
    assert f"could not abort multipart upload {upload['UploadId']} of blobs/stuck" in caplog.text
    assert "AbortIncompleteMultipartUpload" in caplog.text
    direct.abort_multipart_upload(Bucket=mailbox.bucket, Key=upload["Key"], UploadId=upload["UploadId"])


def test_a_complete_whose_answer_is_lost_is_retried_and_returns_the_objects_etag(s3):
    proxy, make, direct = s3
    mailbox = make()
    proxy.fault = once(lambda seen: seen.action == "COMPLETE", DROP)
    data = os.urandom(PART + 99)
    etag = mailbox.put("blobs/lost", data)
    assert mailbox.requests["COMPLETE"] == 2 and etag.endswith("-2")
    found = mailbox.get("blobs/lost", max_bytes=len(data))
    assert (found.data, found.etag) == (data, etag)
    assert pending_uploads(direct, mailbox) == []


# -- create-once -----------------------------------------------------------------------------------


def test_a_create_once_multipart_put_of_an_existing_key_sends_no_part(s3):
    proxy, make, direct = s3
    mailbox = make()
    data = os.urandom(PART + 5)
    first = mailbox.put("blobs/once", data, if_absent=True)
    before = len(proxy.seen)
    with pytest.raises(PreconditionFailed, match="blobs/once already exists"):
        mailbox.put("blobs/once", os.urandom(PART + 5), if_absent=True)
    assert [seen.action for seen in proxy.seen[before:]] == ["HEAD"]
    assert mailbox.get("blobs/once", max_bytes=len(data)).etag == first
    assert pending_uploads(direct, mailbox) == []


def test_a_create_once_that_loses_the_race_at_complete_fails_and_leaves_the_winner(s3):
    proxy, make, direct = s3
    mailbox = make()
    winner = b"written by the other node"

    def race(seen: Seen) -> None:
        if seen.action == "COMPLETE":  # another writer creates the key between our HEAD and complete
            direct.put_object(Bucket=mailbox.bucket, Key=f"{mailbox.prefix}/blobs/race", Body=winner)

    proxy.fault = race
    with pytest.raises(PreconditionFailed, match="blobs/race already exists"):
        mailbox.put("blobs/race", os.urandom(PART + 5), if_absent=True)
    assert proxy.actions() == ["HEAD", "UPLOAD", "PART", "PART", "COMPLETE", "ABORT"]
    assert mailbox.get("blobs/race").data == winner
    assert pending_uploads(direct, mailbox) == []


def test_a_retried_create_once_complete_refused_412_succeeds_when_the_key_holds_this_upload(s3):
    # moto answers a retried complete 200; AWS may answer 412, its earlier try having created the key.
    proxy, make, direct = s3
    mailbox = make()
    completes = iter([DROP, TAKEN])
    proxy.fault = lambda seen: next(completes) if seen.action == "COMPLETE" else None
    data = os.urandom(PART + 3)
    etag = mailbox.put("blobs/mine", data, if_absent=True)
    assert etag.endswith("-2") and mailbox.requests["COMPLETE"] == 2
    assert proxy.actions()[-2:] == ["COMPLETE", "HEAD"]  # the HEAD that found the upload's own etag
    assert mailbox.get("blobs/mine", max_bytes=len(data)).etag == etag
    assert pending_uploads(direct, mailbox) == []


def test_a_retried_create_once_complete_refused_412_fails_when_another_writer_won(s3):
    proxy, make, direct = s3
    mailbox = make()
    winner = b"theirs"

    def fail_then_race(seen: Seen) -> str | None:
        if seen.action != "COMPLETE":
            return None
        if mailbox.requests["COMPLETE"] == 1:  # our first try fails; meanwhile another writer wins
            direct.put_object(Bucket=mailbox.bucket, Key=f"{mailbox.prefix}/blobs/theirs", Body=winner)
            return FAIL
        return None  # moto itself refuses the retry: 412, the key exists

    proxy.fault = fail_then_race
    with pytest.raises(PreconditionFailed, match="blobs/theirs already exists .*may have written it"):
        mailbox.put("blobs/theirs", os.urandom(PART + 3), if_absent=True)
    assert proxy.actions()[-4:] == ["COMPLETE", "COMPLETE", "HEAD", "ABORT"]  # the HEAD: not our etag
    assert mailbox.get("blobs/theirs").data == winner
    assert pending_uploads(direct, mailbox) == []


def test_compare_and_swap_goes_as_one_put_whatever_its_size(s3):
    proxy, make, _ = s3
    mailbox = make()
    etag = mailbox.put("big.json", b"{}")
    data = os.urandom(PART + 1)
    assert "-" not in mailbox.put("big.json", data, if_match=etag)
    assert proxy.actions() == ["PUT", "PUT"]


# -- sizes the store cannot take -------------------------------------------------------------------


@pytest.fixture
def dummy_credentials(monkeypatch):
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def sparse_view(tmp_path: Path) -> Iterator[Callable[[int], memoryview]]:
    """Views of sparse files: payloads of many GiB that occupy neither memory nor disk."""
    opened: list[tuple[object, mmap.mmap, memoryview]] = []

    def make(size: int) -> memoryview:
        path = tmp_path / f"sparse-{len(opened)}"
        file = path.open("w+b")
        try:
            file.truncate(size)
        except OSError as error:  # a file system without sparse files this large
            file.close()
            pytest.skip(f"cannot make a sparse file of {size} bytes in {tmp_path}: {error}")
        mapped = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)
        view = memoryview(mapped)
        opened.append((file, mapped, view))
        return view

    yield make
    for file, mapped, view in opened:
        view.release()
        with contextlib.suppress(BufferError):  # a traceback still holds a view: the collector closes it
            mapped.close()
        file.close()


@pytest.fixture
def unreachable(dummy_credentials) -> Iterator[Callable[..., S3Mailbox]]:
    """Mailboxes at a port nobody listens on: should a size check ever let a huge put through, it fails at
    its first request (none of these sends a body that large anywhere, nor copies it)."""
    with socket.socket() as reserved:
        reserved.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{reserved.getsockname()[1]}"
        yield lambda **options: S3Mailbox(
            "bucket",
            "run",
            endpoint_url=url,
            region="us-east-1",
            **{"retries": 1, "part_size": PART, **options},
        )


def test_a_payload_over_what_10000_parts_carry_is_refused_before_any_request(unreachable, sparse_view):
    mailbox = unreachable()
    size = 10_000 * PART + 1
    with pytest.raises(
        ConfigError,
        match=rf"put\('blobs/huge'\) of {size} bytes .* over the {10_000 * PART}-byte limit .*"
        rf"part_size={PART} .*S3Mailbox\(part_size=\.\.\.\) of at least {PART + 1} bytes",
    ):
        mailbox.put("blobs/huge", sparse_view(size))
    assert mailbox.requests == {}


@pytest.mark.parametrize(("part_size", "limit"), [(PART, 10_000 * PART), (5 << 30, 5 << 40)])
def test_a_payload_over_5_tib_is_refused_whatever_the_part_size(unreachable, sparse_view, part_size, limit):
    mailbox = unreachable(part_size=part_size)
    with pytest.raises(ConfigError, match=rf"over the {limit}-byte limit .*; 5 TiB is .*split the payload"):
        mailbox.put("blobs/too-big", sparse_view((5 << 40) + 1))
    assert mailbox.requests == {}


def test_a_compare_and_swap_over_5_gib_is_refused_before_any_request(unreachable, sparse_view):
    mailbox = unreachable(multipart_threshold=PART)
    with pytest.raises(ConfigError, match=r"over the 5368709120-byte \(5 GiB\) limit of one PutObject"):
        mailbox.put("big.json", sparse_view((5 << 30) + 1), if_match="abc")
    assert mailbox.requests == {}


def test_a_payload_of_exactly_the_limit_is_let_through_to_the_store(unreachable, sparse_view):
    # The refusals above are the size rule, not any large put failing: this one reaches for the store.
    mailbox = unreachable()
    with pytest.raises(MailboxUnavailable, match="UPLOAD blobs/fits .* failed 1 times"):
        mailbox.put("blobs/fits", sparse_view(10_000 * PART))
    assert mailbox.requests == {"UPLOAD": 1}


# -- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"part_size": PART - 1}, f"part_size={PART - 1} must be"),
        ({"part_size": (5 << 30) + 1}, "to 5368709120 (5 GiB, its largest)"),
        ({"part_size": 6.0 * MiB}, "part_size=6291456.0"),
        ({"multipart_threshold": -1}, "multipart_threshold=-1 must be"),
        ({"multipart_threshold": (5 << 30) + 1}, "the most one PutObject carries"),
        ({"multipart_threshold": True}, "multipart_threshold=True"),
    ],
)
def test_bad_part_sizes_and_thresholds_are_refused_naming_the_option(options, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        S3Mailbox("bucket", "run", **options)


def test_a_copy_keeps_the_part_size_and_threshold():
    mailbox = S3Mailbox("bucket", "run", multipart_threshold=100 * MiB, part_size=8 * MiB)
    copy = pickle.loads(pickle.dumps(mailbox))
    assert (copy.multipart_threshold, copy.part_size) == (100 * MiB, 8 * MiB)
    assert (S3Mailbox("bucket").multipart_threshold, S3Mailbox("bucket").part_size) == (64 * MiB, 16 * MiB)
