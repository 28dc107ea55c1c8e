"""How S3Mailbox makes its botocore client: once per mailbox and process, on a thread of its own as the
mailbox is made (so joining a run does not wait for it), from a loader shared by every mailbox, and without
looking anywhere for credentials beyond the environment that gives them."""

from __future__ import annotations

import multiprocessing
import threading

import botocore.utils
import pytest

import slowlink.mailbox.s3 as s3_module
from slowlink.errors import ConfigError
from slowlink.mailbox import s3_options
from slowlink.mailbox.s3 import S3Mailbox
from tests.s3server import fresh_s3_mailbox


def counting_make_client(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every client S3Mailbox makes from now on, by the name of the thread that made it."""
    made, real = [], s3_module.make_client

    def make(**options):
        made.append(threading.current_thread().name)
        return real(**options)

    monkeypatch.setattr(s3_module, "make_client", make)
    return made


def wait_for_background_clients() -> None:
    for thread in threading.enumerate():
        if thread.name == "slowlink-s3-client":
            thread.join(timeout=10)


def test_the_client_is_made_once_in_the_background_as_the_mailbox_is_made(s3_endpoint, monkeypatch):
    made = counting_make_client(monkeypatch)
    with fresh_s3_mailbox(s3_endpoint) as mailbox:
        wait_for_background_clients()
        assert made == ["slowlink-s3-client"]  # before any request, not on the caller's thread
        assert sum(mailbox.requests.values()) == 0
        mailbox.put("a", b"1")
        assert mailbox.get("a").data == b"1"
        mailbox.list("")
        assert made == ["slowlink-s3-client"]  # and never again


def test_a_client_the_background_could_not_make_fails_the_first_request_with_its_error(monkeypatch):
    def refuse(**options):
        raise ConfigError(
            "cannot make an S3 client for s3://bucket: bad region; check endpoint_url and region"
        )

    monkeypatch.setattr(s3_module, "make_client", refuse)
    mailbox = S3Mailbox("bucket", endpoint_url="http://127.0.0.1:9")
    wait_for_background_clients()
    with pytest.raises(ConfigError, match="cannot make an S3 client"):
        mailbox.get("run.json")


def test_clients_share_one_loader_that_lists_only_s3_and_still_loads_its_description():
    first = S3Mailbox("bucket", endpoint_url="http://127.0.0.1:9")._client()
    second = S3Mailbox("bucket", "other", endpoint_url="http://127.0.0.1:9")._client()
    assert first is not second  # each mailbox its own client (and connections)
    loader = s3_options._LOADER
    assert loader.list_available_services("service-2") == ["s3"]  # no walk of ~400 service folders
    assert loader.load_service_model("s3", "service-2")["metadata"]["endpointPrefix"] == "s3"
    assert first.meta.service_model.service_name == second.meta.service_model.service_name == "s3"


def test_credentials_from_the_environment_never_start_an_instance_metadata_probe(s3_endpoint, monkeypatch):
    # Off EC2, asking the instance metadata service (IMDS) for credentials waits for its timeouts.
    probes = []
    for fetcher in (botocore.utils.InstanceMetadataFetcher, botocore.utils.ContainerMetadataFetcher):
        for name in ("retrieve_iam_role_credentials", "retrieve_full_uri", "retrieve_uri"):
            if hasattr(fetcher, name):
                monkeypatch.setattr(fetcher, name, lambda *a, _name=name, **k: probes.append(_name) or {})
    with fresh_s3_mailbox(s3_endpoint) as mailbox:
        mailbox.put("a", b"1")
        assert mailbox.get("a").data == b"1"
    assert probes == []


def _client_in_child(mailbox: S3Mailbox, parent_client_id: int, answers) -> None:
    client = mailbox._client()
    answers.put((id(client) != parent_client_id, mailbox._client() is client))


def test_a_mailbox_forked_into_a_child_process_makes_a_client_of_its_own():
    mailbox = S3Mailbox("bucket", endpoint_url="http://127.0.0.1:9")
    parent_client = mailbox._client()
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    child = context.Process(target=_client_in_child, args=(mailbox, id(parent_client), answers))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert answers.get(timeout=5) == (True, True)  # a new client in the child, kept for its next requests
    assert mailbox._client() is parent_client
