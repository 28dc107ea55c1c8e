"""Run keys: with a secret the run's nodes share, every record a node writes is signed, and a record that
is unsigned or signed with another key is refused before anyone reads it.

A record's signature is HMAC-SHA256 over the run's id, its key in the store and its bytes, so a record
copied to another key (a contribution replayed into a later round) or from another run signed with the same
key fails too. run.json names the run id itself and is signed under the empty run id; a `Signed` mailbox
learns its run from the first run.json it verifies or writes. A contribution (`.delta`: a payload whose
header holds its claims) carries a signature after its bytes, an HMAC over the run's id, its key and its
sha256; other payloads need none of their own: each is named by its sha256 in a signed record (commits,
run.json), and readers check it. The key protects what enters the model; someone who can write to the store can still delete or
stall (docs/robustness.md, "Threat model").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Callable

from ..errors import ConfigError, PayloadError
from ..mailbox.contract import Listing, Mailbox, Object

ENVIRONMENT_VARIABLE = "SLOWLINK_RUN_KEY"
# The signature is the record's last field: ,"signature":"<key id>:<hmac>"} — found and cut by position.
_SIGNATURE = re.compile(rb',"signature":"([0-9a-f]{16}):([0-9a-f]{64})"}$')
# A signed payload ends with \n#signature:<key id>:<hmac> — found and cut by position too.
_TRAILER = re.compile(rb"\n#signature:([0-9a-f]{16}):([0-9a-f]{64})$")
TRAILER_BYTES = 93
SIGNED_PAYLOAD = ".delta"  # the keys of payloads signed themselves: contributions


class RunKey:
    """The secret of one run. `key_id` names it without revealing it, so a mismatch can be reported."""

    def __init__(self, secret: str | bytes) -> None:
        if isinstance(secret, str):
            secret = secret.encode()
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise ConfigError(
                "run_key must be a secret of at least 16 bytes shared by every node of the run, e.g. "
                "python -c 'import secrets; print(secrets.token_hex(32))'"
            )
        self._secret = secret
        self.key_id = hmac.new(secret, b"slowlink run key id", hashlib.sha256).hexdigest()[:16]

    @classmethod
    def resolve(cls, run_key: str | bytes | RunKey | None) -> RunKey | None:
        """The run key given, else the one in SLOWLINK_RUN_KEY, else None (an unsigned run)."""
        if isinstance(run_key, RunKey):
            return run_key
        if run_key is None:
            run_key = os.environ.get(ENVIRONMENT_VARIABLE) or None
        return None if run_key is None else cls(run_key)

    def _mac(self, run_id: str, key: str, body: bytes) -> str:
        scope = f"{run_id}\n{key}\n".encode()
        return hmac.new(self._secret, scope + body, hashlib.sha256).hexdigest()

    def sign(self, key: str, body: bytes, run_id: str = "") -> bytes:
        """The JSON object `body` with a signature field added as its last field, bound to `run_id`."""
        if not (body.startswith(b"{") and body.endswith(b"}")) or body == b"{}":
            raise ValueError(f"only non-empty JSON objects are signed, not {body[:40]!r} at {key}")
        return body[:-1] + f',"signature":"{self.key_id}:{self._mac(run_id, key, body)}"}}'.encode()

    def sign_payload(self, key: str, data: bytes, run_id: str) -> bytes:
        """The payload `data` with a signature after it, bound to `run_id`, `key` and its sha256."""
        return data + f"\n#signature:{self.key_id}:{self._payload_mac(run_id, key, data)}".encode()

    def _payload_mac(self, run_id: str, key: str, data: bytes) -> str:
        return self._mac(run_id, key, hashlib.sha256(data).hexdigest().encode())

    def verify_payload(self, key: str, data: bytes, run_id: str) -> bytes:
        """The payload as it was signed, without its signature; PayloadError if unsigned or forged."""
        match = _TRAILER.search(data[-TRAILER_BYTES:])
        body = data[:-TRAILER_BYTES]
        return self._check(key, match, lambda: self._payload_mac(run_id, key, body), body)

    def verify(self, key: str, data: bytes, run_id: str = "") -> bytes:
        """The record as it was signed, without its signature; PayloadError if unsigned or forged."""
        match = _SIGNATURE.search(data)
        body = data[: match.start()] + b"}" if match is not None else data
        return self._check(key, match, lambda: self._mac(run_id, key, body), body)

    def _check(self, key: str, match: re.Match | None, mac_of: Callable[[], str], body: bytes) -> bytes:
        if match is None:
            raise PayloadError(
                f"{key} is unsigned, though this node checks every record with the run key: it may be forged "
                "by someone without the key, or written by a node given no run_key (every node of a signed "
                "run needs the same run_key or SLOWLINK_RUN_KEY); it is treated as absent"
            )
        key_id, mac = match.group(1).decode(), match.group(2).decode()
        if key_id != self.key_id:
            raise PayloadError(
                f"{key} is signed with run key {key_id}, not this node's {self.key_id}: every node of a run "
                "needs the same run_key (or SLOWLINK_RUN_KEY)"
            )
        if not hmac.compare_digest(mac, mac_of()):
            raise PayloadError(
                f"{key} has a forged signature: its bytes, its place or its run differ from what was signed"
            )
        return body


RUN_RECORD = "run.json"  # signed under the empty run id: it is what names the run
# ... as is the creation claim, written before there is a run (creation.py; only its etag is ever watched)
UNBOUND = {RUN_RECORD, "creating.json"}


class Signed:
    """A mailbox wrapper that signs every record (`.json` key) and contribution (`.delta`) written and
    verifies every one read.

    Records other than run.json are bound to the run's id, which this wrapper takes from the first run.json
    it writes or verifies; before that, only run.json (and the creation claim) can be read or written."""

    def __init__(self, inner: Mailbox, run_key: RunKey) -> None:
        self.inner, self.run_key = inner, run_key
        self.run_id: str | None = None

    def _scope(self, key: str) -> str:
        if key in UNBOUND:
            return ""
        if self.run_id is None:
            raise PayloadError(f"{key} cannot be checked before {RUN_RECORD} names the run it belongs to")
        return self.run_id

    def _bind(self, body: bytes) -> None:
        try:
            run_id = json.loads(body).get("run_id")
        except (ValueError, AttributeError, RecursionError):
            return  # not a run record; the protocol's own decoding says why
        if not isinstance(run_id, str):
            return
        if self.run_id is not None and self.run_id != run_id:
            raise PayloadError(
                f"{RUN_RECORD} now names run {run_id[:8]}, but this node is in run {self.run_id[:8]}: the run "
                "record was replaced; leave and check the mailbox"
            )
        self.run_id = run_id

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        if key.endswith(".json"):
            scope = self._scope(key)
            signed = self.run_key.sign(key, data, scope)
            etag = self.inner.put(key, signed, if_absent=if_absent, if_match=if_match)
            if key == RUN_RECORD:
                self._bind(data)
            return etag
        if key.endswith(SIGNED_PAYLOAD):
            data = self.run_key.sign_payload(key, data, self._scope(key))
        return self.inner.put(key, data, if_absent=if_absent, if_match=if_match)

    def get(
        self, key: str, *, if_none_match: str | None = None, max_bytes: int | None = None
    ) -> Object | None:
        signed_payload = key.endswith(SIGNED_PAYLOAD)
        if signed_payload and max_bytes is not None:
            max_bytes += TRAILER_BYTES
        found = self.inner.get(key, if_none_match=if_none_match, max_bytes=max_bytes)
        if signed_payload and found is not None and found.data is not None:
            return Object(self.run_key.verify_payload(key, found.data, self._scope(key)), found.etag)
        if found is None or found.data is None or not key.endswith(".json"):
            return found
        body = self.run_key.verify(key, found.data, self._scope(key))
        if key == RUN_RECORD:
            self._bind(body)
        return Object(body, found.etag)

    def list(self, prefix: str, *, start_after: str | None = None) -> list[Listing]:
        return self.inner.list(prefix, start_after=start_after)

    def delete(self, keys: list[str]) -> None:
        self.inner.delete(keys)

    def clock(self) -> float:
        return self.inner.clock()

    def __getattr__(self, name: str):  # counters of the wrapped mailbox (requests, bytes) stay readable
        return getattr(self.inner, name)


def trusted_view(mailbox: Mailbox, run_key: RunKey | None) -> Mailbox:
    """With a run key, the mailbox as the protocol sees it: every record signed on write, checked on read."""
    return mailbox if run_key is None else Signed(mailbox, run_key)
