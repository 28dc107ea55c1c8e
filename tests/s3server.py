"""A real S3 HTTP server for tests and benchmarks: moto's server on 127.0.0.1, or the store in the environment.

`moto_server()` starts `python -m moto.server` on a free port and stops it at the end; `open_s3_endpoint()`
adds a bucket and dummy credentials (benchmarks use it), and `s3_endpoint` is a session-scoped pytest fixture
over that, which test folders import into their conftest.py. When SLOWLINK_S3_ENDPOINT is set (with
SLOWLINK_S3_BUCKET and credentials in the environment), that store is used instead of moto.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

# moto accepts any credentials; these keep boto3 from finding a user's real ones while tests run.
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True)
class S3Endpoint:
    """Where the S3 tests run: the endpoint, a bucket that exists there, and whether it is our own moto."""

    url: str
    bucket: str
    region: str
    is_moto: bool
    request_checksums: str = "when_supported"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_answering(url: str, process: subprocess.Popen, deadline_seconds: float) -> None:
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with code {process.returncode} before answering at {url}")
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer means it is up
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"moto server did not answer at {url} within {deadline_seconds} s")


@contextlib.contextmanager
def moto_server(*, start_deadline_seconds: float = 30.0) -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1 for the duration of the block; yields its endpoint URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_until_answering(url, process, start_deadline_seconds)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def dummy_credentials() -> Iterator[None]:
    """Set moto's dummy credentials in the environment for the block, then restore what was there."""
    saved = {name: os.environ.get(name) for name in DUMMY_CREDENTIALS}
    os.environ.update(DUMMY_CREDENTIALS)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def create_bucket(endpoint_url: str, bucket: str, region: str = "us-east-1") -> None:
    import boto3

    client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region)
    client.create_bucket(Bucket=bucket)


@contextlib.contextmanager
def open_s3_endpoint() -> Iterator[S3Endpoint]:
    """The configured endpoint if SLOWLINK_S3_ENDPOINT is set, else a fresh moto server with one bucket."""
    configured = os.environ.get("SLOWLINK_S3_ENDPOINT")
    if configured:
        bucket = os.environ.get("SLOWLINK_S3_BUCKET")
        if not bucket:
            raise RuntimeError(
                "SLOWLINK_S3_ENDPOINT is set but SLOWLINK_S3_BUCKET is not; name a bucket to test in"
            )
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        # Hugging Face buckets need "when_required"; say so with SLOWLINK_S3_REQUEST_CHECKSUMS.
        checksums = os.environ.get("SLOWLINK_S3_REQUEST_CHECKSUMS", "when_supported")
        yield S3Endpoint(configured, bucket, region, is_moto=False, request_checksums=checksums)
        return
    with dummy_credentials(), moto_server() as url:
        create_bucket(url, "slowlink-tests")
        yield S3Endpoint(url, "slowlink-tests", "us-east-1", is_moto=True)


@contextlib.contextmanager
def fresh_s3_mailbox(endpoint: S3Endpoint, **options: Any) -> Iterator[Any]:
    """An S3Mailbox under a prefix no other test uses; whatever it holds is deleted at the end."""
    from slowlink.mailbox.s3 import S3Mailbox

    mailbox = S3Mailbox(
        endpoint.bucket,
        f"slowlink-tests/{uuid.uuid4().hex}",
        endpoint_url=endpoint.url,
        region=endpoint.region,
        request_checksums=endpoint.request_checksums,
        **options,
    )
    try:
        yield mailbox
    finally:
        mailbox.delete([listing.key for listing in mailbox.list("")])


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    pytest.importorskip("boto3")
    if not os.environ.get("SLOWLINK_S3_ENDPOINT"):
        pytest.importorskip("moto", reason="moto[server] is the S3 server these tests start")
    with open_s3_endpoint() as endpoint:
        yield endpoint
