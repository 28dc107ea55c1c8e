"""An S3 store holding what slowlink could not have written, or answering with more than it should.

Odd keys are written into moto's real server with boto3 directly; an answer that does not end where its
length says (or states none) comes from a tiny HTTP server on 127.0.0.1 that streams without end.
"""

from __future__ import annotations

import http.server
import os
import threading
import uuid

import pytest

from slowlink.errors import ObjectTooLarge
from slowlink.mailbox.metered import Metered
from tests.mailbox.recording_hook import Hook
from tests.s3server import dummy_credentials, fresh_s3_mailbox

ODD_S3_KEYS = [
    "rounds/0000/0000000001/a b",
    "rounds/0000/0000000001/../../../etc/passwd",
    "rounds/0000/0000000001/",  # a "folder" as consoles make them
    "rounds/0000//x.json",
    "rounds/0000/0000000001/é.json",
]


def test_s3_keys_slowlink_could_not_have_written_are_skipped_by_list_and_reported(s3_endpoint):
    import boto3

    with fresh_s3_mailbox(s3_endpoint) as mailbox:
        hook = Hook()
        mailbox.on_ignored = hook
        etag = mailbox.put("rounds/0000/0000000001/a.json", b"{}")
        client = boto3.session.Session().client(
            "s3", endpoint_url=s3_endpoint.url, region_name=s3_endpoint.region
        )
        for key in ODD_S3_KEYS:
            client.put_object(Bucket=s3_endpoint.bucket, Key=f"{mailbox.prefix}/{key}", Body=b"{}")
        try:
            for _ in range(2):
                listed = mailbox.list("rounds/")
                assert [(item.key, item.etag) for item in listed] == [("rounds/0000/0000000001/a.json", etag)]
            assert sorted(hook.keys) == sorted(ODD_S3_KEYS)  # each once
        finally:
            for key in ODD_S3_KEYS:
                client.delete_object(Bucket=s3_endpoint.bucket, Key=f"{mailbox.prefix}/{key}")


def test_an_s3_object_over_the_limit_is_refused_before_its_bytes_are_read(s3_endpoint):
    with fresh_s3_mailbox(s3_endpoint) as mailbox:
        mailbox.put("blobs/big", os.urandom(4 << 20))
        metered = Metered(mailbox)
        received = mailbox.bytes_received
        with pytest.raises(ObjectTooLarge, match=f"blobs/big .*{4 << 20} bytes.*1024-byte limit"):
            metered.get("blobs/big", max_bytes=1024)
        assert mailbox.bytes_received == received and metered.bytes_received == 0
        assert mailbox.get("blobs/big", max_bytes=4 << 20).data is not None  # at the limit: read


class _EndlessObject(http.server.BaseHTTPRequestHandler):
    """Answers every GET with 200 and a body that does not end where its headers say (or at all)."""

    protocol_version = "HTTP/1.1"
    stated_length: int | None = None  # None: chunked, with no length at all

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("ETag", '"0123456789abcdef"')
        if self.stated_length is None:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(self.stated_length))
        self.end_headers()
        chunk = b"x" * (1 << 16)
        try:
            for _ in range(1 << 12):  # 256 MiB, unless the reader hangs up first
                frame = b"%x\r\n%s\r\n" % (len(chunk), chunk) if self.stated_length is None else chunk
                self.wfile.write(frame)
                self.server.sent += len(chunk)  # type: ignore[attr-defined]
        except OSError:
            pass
        self.close_connection = True


@pytest.mark.parametrize("stated_length", [None, 10 << 30], ids=["no length", "a length of 10 GiB"])
def test_an_s3_answer_that_keeps_coming_is_cut_off_at_the_limit(stated_length):
    from slowlink.mailbox.s3 import S3Mailbox

    handler = type("Handler", (_EndlessObject,), {"stated_length": stated_length})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.sent = 0  # type: ignore[attr-defined]
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        with dummy_credentials():
            mailbox = S3Mailbox(
                "bucket", uuid.uuid4().hex, endpoint_url=f"http://127.0.0.1:{server.server_address[1]}",
                region="us-east-1", retries=1,
            )  # fmt: skip
            with pytest.raises(ObjectTooLarge, match="blobs/endless"):
                mailbox.get("blobs/endless", max_bytes=1 << 20)
        assert mailbox.bytes_received <= (1 << 20) + 1
        if stated_length is not None:
            assert mailbox.bytes_received == 0  # refused on its stated length alone
    finally:
        server.shutdown()
        server.server_close()
    assert server.sent < 1 << 28  # the reader hung up long before the end
