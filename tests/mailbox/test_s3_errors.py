"""S3Mailbox when the store fails or differs: missing bucket, 5xx, throttling, timeouts, 403, 409, odd gateways.

Faults are real where they can be: moto's server for a missing bucket, and otherwise a tiny HTTP server on
127.0.0.1 (ScriptedStore) that answers each request as a test scripts it, and counts what it received.
"""

from __future__ import annotations

import http.server
import pickle
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from slowlink.errors import ConfigError, MailboxRejected, MailboxUnavailable, PreconditionFailed
from slowlink.mailbox import Listing, Object
from slowlink.mailbox.s3 import Retries, S3Mailbox, Timeouts
from tests.s3server import DUMMY_CREDENTIALS, fresh_s3_mailbox

FAST_RETRIES = Retries(attempts=3, first_backoff=0.001, max_backoff=0.002)


@dataclass
class Reply:
    status: int = 200
    code: str = ""  # an S3 error code, sent in the XML error body
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False  # read the request, then never answer
    delay: float = 0.0
    cut_short: bool = False  # promise the whole body, send a tenth of it, hang up


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class ScriptedStore:
    """An HTTP server on 127.0.0.1 answering each request with `script(seen, n)`; records every request."""

    def __init__(self, script: Callable[[Seen, int], Reply], *, clock_offset: float = 0.0) -> None:
        self.script, self.clock_offset = script, clock_offset
        self.seen: list[Seen] = []
        self.in_flight = self.most_in_flight = 0
        self._lock, self._stop = threading.Lock(), threading.Event()
        store = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else each small answer waits out a delayed ACK

            def log_message(self, *args: object) -> None:
                pass

            def date_time_string(self, timestamp: float | None = None) -> str:
                return super().date_time_string(time.time() + store.clock_offset)

            def handle_one_request(self) -> None:
                # Dispatch every method to one place: S3 uses GET, PUT, HEAD, POST and DELETE.
                self.raw_requestline = self.rfile.readline(65537)
                if not self.raw_requestline or not self.parse_request():
                    self.close_connection = True
                    return
                store.answer(self)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def answer(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        seen = Seen(handler.command, handler.path, dict(handler.headers), handler.rfile.read(length))
        with self._lock:
            self.seen.append(seen)
            reply = self.script(seen, len(self.seen) - 1)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            time.sleep(reply.delay)
            if reply.hang:
                self._stop.wait(10)
                handler.close_connection = True
                return
            body = reply.body
            if reply.code:
                body = f"<Error><Code>{reply.code}</Code><Message>scripted</Message></Error>".encode()
            handler.send_response(reply.status)
            for name, value in reply.headers.items():
                handler.send_header(name, value)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            if handler.command != "HEAD":
                handler.wfile.write(body[: len(body) // 10] if reply.cut_short else body)
            if reply.cut_short:
                handler.close_connection = True
        finally:
            with self._lock:
                self.in_flight -= 1

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def dummy_credentials(monkeypatch):
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def scripted(dummy_credentials):
    """Start ScriptedStore(script) servers on demand; all are stopped at the end of the test."""
    stores: list[ScriptedStore] = []

    def start(script: Callable[[Seen, int], Reply] | Reply, **options) -> ScriptedStore:
        store = ScriptedStore(script if callable(script) else lambda seen, n: script, **options)
        stores.append(store)
        return store

    yield start
    for store in stores:
        store.close()


def mailbox_at(store: ScriptedStore, **options) -> S3Mailbox:
    options.setdefault("retries", FAST_RETRIES)
    options.setdefault("timeout", Timeouts(connect=2.0, read=2.0))
    return S3Mailbox("bucket", "run", endpoint_url=store.url, region="us-east-1", **options)


VERBS = {
    "put": lambda mailbox: mailbox.put("k", b"data"),
    "get": lambda mailbox: mailbox.get("k"),
    "list": lambda mailbox: mailbox.list("r/"),
    "delete": lambda mailbox: mailbox.delete(["k"]),
}
HTTP_VERB = {"put": "PUT", "get": "GET", "list": "LIST", "delete": "DELETE"}


# -- transient failures: retried, then MailboxUnavailable -------------------------------------------


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize(
    ("status", "code"), [(500, "InternalError"), (503, "SlowDown"), (400, "RequestTimeout")]
)
def test_a_store_that_keeps_failing_transiently_is_tried_exactly_the_configured_times(
    scripted, verb, status, code
):
    store = scripted(Reply(status, code))
    mailbox = mailbox_at(store)
    with pytest.raises(
        MailboxUnavailable,
        match=rf"{HTTP_VERB[verb]} .* failed 3 times; last error: HTTP {status} {code} scripted",
    ):
        VERBS[verb](mailbox)
    assert len(store.seen) == 3
    assert mailbox.requests == {HTTP_VERB[verb]: 3} and mailbox.retried == {HTTP_VERB[verb]: 2}


def test_a_store_that_never_answers_times_out_on_each_try_then_is_unavailable(scripted):
    store = scripted(Reply(hang=True))
    mailbox = mailbox_at(store, timeout=Timeouts(connect=1.0, read=0.05))
    started = time.monotonic()
    with pytest.raises(MailboxUnavailable, match=r"GET k .* failed 3 times; last error: Read timeout"):
        mailbox.get("k")
    assert len(store.seen) == 3
    assert time.monotonic() - started < 5.0  # three short timeouts, not a default one


def test_an_endpoint_nobody_listens_on_is_tried_then_unavailable(dummy_credentials):
    with socket_nobody_listens_on() as url:
        mailbox = S3Mailbox("bucket", endpoint_url=url, region="us-east-1", retries=FAST_RETRIES)
        with pytest.raises(MailboxUnavailable, match="Could not connect"):
            mailbox.put("k", b"x")
    assert mailbox.requests == {"PUT": 3}


class socket_nobody_listens_on:
    """A 127.0.0.1 port reserved by a bound socket that never listens: connecting to it is refused."""

    def __enter__(self) -> str:
        import socket

        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def __exit__(self, *exc: object) -> None:
        self.socket.close()


def test_transient_failures_then_success_return_the_successful_answer(scripted):
    replies = [Reply(503, "SlowDown"), Reply(500, "InternalError"), Reply(200, headers={"ETag": '"e3"'})]
    store = scripted(lambda seen, n: replies[n])
    assert mailbox_at(store).put("k", b"x") == "e3"
    assert [seen.method for seen in store.seen] == ["PUT"] * 3


def test_a_get_whose_body_is_cut_short_is_retried_whole(scripted):
    data = bytes(range(200))
    replies = [Reply(200, body=data, cut_short=True), Reply(200, body=data, headers={"ETag": '"e"'})]
    store = scripted(lambda seen, n: replies[n])
    mailbox = mailbox_at(store)
    assert mailbox.get("k") == Object(data, "e")
    assert len(store.seen) == 2


# -- permanent refusals: never retried -------------------------------------------------------------


def test_a_bucket_that_does_not_exist_is_rejected_at_once_naming_the_bucket(s3_endpoint):
    bucket = f"slowlink-no-such-{uuid.uuid4().hex[:16]}"  # random, so that no one else owns it either
    mailbox = S3Mailbox(bucket, "run", endpoint_url=s3_endpoint.url, region=s3_endpoint.region)
    for verb, call in VERBS.items():
        with pytest.raises(
            MailboxRejected, match=f"bucket '{bucket}' does not exist at .*; create it or fix the name"
        ):
            call(mailbox)
        assert mailbox.requests[HTTP_VERB[verb]] == 1


@pytest.mark.parametrize("verb", VERBS)
def test_a_403_is_rejected_at_once_naming_bucket_prefix_and_credentials(scripted, verb):
    store = scripted(Reply(403, "AccessDenied"))
    with pytest.raises(
        MailboxRejected, match="no permission for bucket 'bucket' at prefix 'run'.*check credentials"
    ):
        VERBS[verb](mailbox_at(store))
    assert len(store.seen) == 1


@pytest.mark.parametrize(("status", "code"), [(400, "InvalidArgument"), (501, "NotImplemented"), (405, "")])
def test_other_refusals_are_raised_after_one_request_naming_the_answer(scripted, status, code):
    store = scripted(Reply(status, code))
    with pytest.raises(MailboxRejected, match=f"PUT k in s3://bucket/run at {store.url} was refused"):
        mailbox_at(store).put("k", b"x")
    assert len(store.seen) == 1


# -- conditional writes ----------------------------------------------------------------------------


def test_conditional_writes_send_the_etag_quoted_and_a_412_is_precondition_failed(scripted):
    store = scripted(Reply(412, "PreconditionFailed"))
    mailbox = mailbox_at(store)
    with pytest.raises(PreconditionFailed, match="k changed since etag abc"):
        mailbox.put("k", b"x", if_match="abc")
    with pytest.raises(PreconditionFailed, match="k already exists"):
        mailbox.put("k", b"x", if_absent=True)
    assert store.seen[0].headers["If-Match"] == '"abc"'
    assert store.seen[1].headers["If-None-Match"] == "*"
    assert len(store.seen) == 2


def test_a_409_conflict_is_retried_and_a_later_412_means_the_race_was_lost(scripted):
    replies = [Reply(409, "ConditionalRequestConflict"), Reply(412, "PreconditionFailed")]
    store = scripted(lambda seen, n: replies[n])
    with pytest.raises(PreconditionFailed, match="already exists"):
        mailbox_at(store).put("k", b"x", if_absent=True)
    assert len(store.seen) == 2


@pytest.mark.parametrize(("head", "expected"), [(200, PreconditionFailed), (404, MailboxUnavailable)])
def test_a_409_on_every_try_is_settled_by_one_head_of_the_key(scripted, head, expected):
    def script(seen: Seen, n: int) -> Reply:
        if seen.method == "HEAD":
            return Reply(head, headers={"ETag": '"theirs"'})
        return Reply(409, "ConditionalRequestConflict")

    store = scripted(script)
    with pytest.raises(expected):
        mailbox_at(store).put("k", b"x", if_absent=True)
    assert [seen.method for seen in store.seen] == ["PUT", "PUT", "PUT", "HEAD"]


def test_a_304_reads_as_unchanged_with_the_etag_asked_about(scripted):
    store = scripted(Reply(304, headers={"ETag": '"e1"'}))
    assert mailbox_at(store).get("k", if_none_match="e1") == Object(None, "e1")
    assert store.seen[0].headers["If-None-Match"] == '"e1"'


# -- listing and deleting against gateways ---------------------------------------------------------


def list_page(keys: list[str], token: str | None) -> Reply:
    contents = "".join(
        f"<Contents><Key>{k}</Key><ETag>&quot;{k[-1]}&quot;</ETag><Size>{len(k)}</Size>"
        "<LastModified>2026-01-01T00:00:00.000Z</LastModified></Contents>"
        for k in keys
    )
    more = (
        f"<IsTruncated>true</IsTruncated><NextContinuationToken>{token}</NextContinuationToken>"
        if token
        else ""
    )
    return Reply(200, body=f"<ListBucketResult>{more}{contents}</ListBucketResult>".encode())


def test_listing_follows_pages_and_drops_keys_a_gateway_returns_despite_start_after(scripted):
    # Like Hugging Face's gateway: StartAfter is ignored, so the first page starts at the beginning.
    pages = [list_page(["run/r/1", "run/r/2"], "next"), list_page(["run/r/3", "run/r/4"], None)]
    store = scripted(lambda seen, n: pages[n])
    listed = mailbox_at(store).list("r/", start_after="r/2")
    assert listed == [Listing("r/3", "3", 7), Listing("r/4", "4", 7)]
    assert "start-after=run%2Fr%2F2" in store.seen[0].path
    assert "continuation-token=next" in store.seen[1].path


def test_deleting_1500_keys_sends_two_batches_of_at_most_1000(scripted):
    store = scripted(Reply(200, body=b"<DeleteResult></DeleteResult>"))
    keys = [f"blobs/{n:05d}" for n in range(1500)]
    mailbox_at(store).delete(keys)
    batches = [re.findall(rb"<Key>([^<]+)</Key>", seen.body) for seen in store.seen]
    assert [len(batch) for batch in batches] == [1000, 500]
    assert [k.decode() for batch in batches for k in batch] == [f"run/{key}" for key in keys]


def test_a_key_the_store_refuses_to_delete_is_raised_by_name(scripted):
    refusal = b"<DeleteResult><Error><Key>run/k</Key><Code>AccessDenied</Code></Error></DeleteResult>"
    store = scripted(Reply(200, body=refusal))
    with pytest.raises(
        MailboxRejected, match="no permission for bucket 'bucket' at prefix 'run' \\(DELETE run/k"
    ):
        mailbox_at(store).delete(["k"])
    assert len(store.seen) == 1


# -- configuration, concurrency, clock -------------------------------------------------------------


def test_no_more_requests_are_in_flight_than_max_concurrency(scripted):
    store = scripted(Reply(200, body=b"x", headers={"ETag": '"e"'}, delay=0.05))
    mailbox = mailbox_at(store, max_concurrency=2)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: mailbox.get(f"k{n}"), range(16)))
    assert store.most_in_flight == 2
    assert mailbox.requests == {"GET": 16} and mailbox.bytes_received == 16


def test_the_clock_follows_the_date_the_store_answers_with(scripted):
    store = scripted(Reply(200, body=b"x", headers={"ETag": '"e"'}), clock_offset=3600.0)
    mailbox = mailbox_at(store)
    assert abs(mailbox.clock() - time.time()) < 0.5  # no answer yet: local time
    for _ in range(3):
        mailbox.get("k")
    assert abs(mailbox.clock() - time.time() - 3600.0) < 1.0


@pytest.mark.parametrize(("mode", "sends_checksum"), [("when_supported", True), ("when_required", False)])
def test_request_checksums_decides_whether_a_put_carries_a_checksum(scripted, mode, sends_checksum):
    store = scripted(Reply(200, headers={"ETag": '"e"'}))
    mailbox_at(store, request_checksums=mode).put("k", b"payload")
    headers = {name.lower() for name in store.seen[0].headers}
    assert any(name.startswith("x-amz-checksum-") for name in headers) == sends_checksum
    assert store.seen[0].body == b"payload"


def test_two_prefixes_in_one_bucket_never_see_each_others_keys(s3_endpoint):
    with fresh_s3_mailbox(s3_endpoint) as one, fresh_s3_mailbox(s3_endpoint) as two:
        one.put("head.json", b"one")
        two.put("head.json", b"two")
        assert one.get("head.json").data == b"one" and two.get("head.json").data == b"two"
        assert [item.key for item in one.list("")] == ["head.json"]
        one.delete(["head.json"])
        assert two.get("head.json").data == b"two"


def test_requests_and_bytes_are_counted_per_verb(s3_endpoint):
    with fresh_s3_mailbox(s3_endpoint) as mailbox:
        etag = mailbox.put("a", b"12345")
        mailbox.get("a")
        mailbox.get("a", if_none_match=etag)
        mailbox.list("")
        mailbox.delete(["a"])
        assert mailbox.requests == {"PUT": 1, "GET": 2, "LIST": 1, "DELETE": 1}
        assert (mailbox.bytes_sent, mailbox.bytes_received) == (5, 5)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"request_checksums": "sometimes"}, "request_checksums='sometimes'"),
        ({"max_concurrency": 0}, "max_concurrency=0"),
        ({"endpoint_url": "127.0.0.1:9000"}, "must start with http"),
        ({"retries": 0}, "attempts=0"),
        ({"timeout": 0}, "Timeouts"),
        ({"prefix": "runs/../x"}, "prefix 'runs/../x'"),
        ({"bucket": ""}, "bucket ''"),
    ],
)
def test_the_constructor_rejects_bad_options_naming_them(options, named):
    arguments = {"bucket": "bucket", "prefix": "run", **options}
    with pytest.raises(ConfigError, match=re.escape(named)):
        S3Mailbox(arguments.pop("bucket"), arguments.pop("prefix"), **arguments)


def test_the_constructor_touches_no_network_and_a_copy_keeps_the_configuration():
    with socket_nobody_listens_on() as url:
        mailbox = S3Mailbox("bucket", "/runs/1/", endpoint_url=url, request_checksums="when_required")
    copy = pickle.loads(pickle.dumps(mailbox))
    assert (copy.bucket, copy.prefix, copy.endpoint_url, copy.request_checksums) == (
        "bucket",
        "runs/1",
        url,
        "when_required",
    )
    assert mailbox.requests == {} and copy.requests == {}


def test_without_boto3_slowlink_imports_and_s3mailbox_names_the_extra_to_install():
    program = (
        "import sys; sys.modules['boto3'] = sys.modules['botocore'] = None\n"
        "import slowlink, slowlink.mailbox as m\n"
        "try:\n    m.S3Mailbox\nexcept slowlink.ConfigError as e:\n    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "pip install slowlink[s3]" in result.stdout
