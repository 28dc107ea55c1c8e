"""A mailbox may be named: a path (a string or os.PathLike) is a DirMailbox, `s3://bucket/prefix` an
S3Mailbox whose endpoint comes from the environment as boto3 reads it; anything else is refused, naming
the value and the forms accepted. Session and align take the same names."""

import itertools
import time

import pytest
import torch

import slowlink as sl
from slowlink.mailbox.named import open_mailbox

from .nodes import batches, sgd_step, tiny_mlp

_prefixes = itertools.count()


def train(model, mailbox, steps=4):
    with sl.Session(model, algorithm=sl.DiLoCo(sync_every=2, overlap_steps=0), mailbox=mailbox, node_id="n",
                    poll_seconds=0.005) as session:  # fmt: skip
        for batch in batches(0, steps):
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
    return session


@pytest.mark.parametrize("spelled", [str, lambda path: path], ids=["str", "PathLike"])
def test_a_path_names_a_directory_mailbox_for_session_and_align(tmp_path, spelled):
    folder = tmp_path / "run-1"
    model = tiny_mlp()
    session = train(model, spelled(folder))
    assert isinstance(session.raw_mailbox, sl.DirMailbox) and (folder / "run.json").is_file()
    fresh = tiny_mlp(seed=1)
    versions = sl.align(fresh, mailbox=spelled(folder))
    assert versions == {0: 2}
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True))


def test_an_s3_url_names_an_s3_mailbox_with_the_endpoint_from_the_environment(s3_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint.url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3_endpoint.region)
    url = f"s3://{s3_endpoint.bucket}/named-{next(_prefixes)}-{time.time_ns()}"
    model = tiny_mlp()
    session = train(model, url)
    mailbox = session.raw_mailbox
    assert isinstance(mailbox, sl.S3Mailbox) and mailbox.endpoint_url == s3_endpoint.url
    assert url.endswith(mailbox.prefix) and mailbox.bucket == s3_endpoint.bucket
    fresh = tiny_mlp(seed=1)
    assert sl.align(fresh, mailbox=url) == {0: 2}
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True))


def test_the_general_endpoint_variable_serves_when_the_s3_one_is_unset(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    mailbox = open_mailbox("s3://bucket/runs/run-1")
    assert (mailbox.bucket, mailbox.prefix, mailbox.endpoint_url) == (
        "bucket",
        "runs/run-1",
        "http://127.0.0.1:9",
    )
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert open_mailbox("s3://bucket").endpoint_url is None  # AWS itself


def test_a_mailbox_object_is_taken_as_it_is():
    mailbox = sl.MemoryMailbox()
    assert open_mailbox(mailbox) is mailbox


@pytest.mark.parametrize(
    "value, named",
    [({"path": "x"}, r"\{'path': 'x'\}"), (7, "7"), ("", "''"), ("gs://bucket/run", "'gs://bucket/run'"),
     ("s3://", "'s3://'"), (None, "None")],
)  # fmt: skip
def test_anything_else_is_refused_naming_the_value_and_the_accepted_forms(value, named):
    with pytest.raises(sl.ConfigError, match=rf"mailbox={named}.*s3://bucket/prefix"):
        sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=2), mailbox=value)
    with pytest.raises(sl.ConfigError, match=rf"mailbox={named}"):
        sl.align(tiny_mlp(), mailbox=value)
