"""A mailbox named by a string: what Session and align accept beside a mailbox object.

A path (a string or os.PathLike) is a DirMailbox; `s3://bucket/prefix` is an S3Mailbox, its credentials and
region found by boto3 as usual and its endpoint read from AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (the
variables boto3 itself honours), else AWS's own. Anything else is refused, naming the value and the forms.
"""

from __future__ import annotations

import os
import re

from ..errors import ConfigError
from .contract import Mailbox
from .directory import DirMailbox

VERBS = ("put", "get", "list", "delete")  # what tells a mailbox object from a name
FORMS = (
    "a mailbox object (sl.DirMailbox(path), sl.S3Mailbox(bucket, prefix), sl.MemoryMailbox()), a folder "
    "path such as '/shared/runs/run-1', or 's3://bucket/prefix'"
)
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def open_mailbox(value: object) -> Mailbox:
    """The mailbox `value` names: a mailbox object as it is, a path or an s3:// URL opened (module docstring)."""
    if all(callable(getattr(value, verb, None)) for verb in VERBS):
        return value  # type: ignore[return-value]
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"mailbox={value!r} is not a mailbox; pass {FORMS}")
    if value.startswith("s3://"):
        bucket, _, prefix = value.removeprefix("s3://").partition("/")
        if not bucket:
            raise ConfigError(f"mailbox={value!r} names no bucket; pass {FORMS}")
        from . import S3Mailbox  # boto3 is an optional extra: a ConfigError names it if it is missing

        endpoint = next((os.environ[name] for name in ENDPOINT_VARIABLES if os.environ.get(name)), None)
        return S3Mailbox(bucket, prefix, endpoint_url=endpoint)
    if _SCHEME.match(value):
        raise ConfigError(
            f"mailbox={value!r}: slowlink reads no {value.split('://')[0]}:// store; pass {FORMS}"
        )
    return DirMailbox(value)
