"""sl.align: load the newest committed model into a model without joining the run (for evaluation, export,
or a node that starts from the run's model before it trains)."""

import os

from .errors import ConfigError, RunConfigMismatch
from .frameworks.base import adapter_for, compare_frozen, compare_schemas, frozen_of
from .mailbox.contract import Mailbox
from .mailbox.named import open_mailbox
from .protocol import keys
from .protocol.chain import load_newest
from .protocol.run import read_run
from .protocol.trust import ENVIRONMENT_VARIABLE, RunKey, trusted_view


def align(
    model: object,
    *,
    mailbox: Mailbox | str | os.PathLike,
    run_key: str | bytes | None = None,
    params: object = None,
) -> dict[int, int]:
    """Load the newest committed model into `model` without joining the run; returns fragment -> version.
    mailbox: as Session's (a mailbox, a folder path, or "s3://bucket/prefix"). run_key: the run's key if
    it is signed (default: SLOWLINK_RUN_KEY); every record read is checked. params: the run's choice of
    tensors, as its Session was given it. Only what the run synchronizes is loaded; the model's frozen
    weights must be the run's (SchemaMismatch otherwise)."""
    mailbox = open_mailbox(mailbox)
    adapter = adapter_for(model, params)
    key = RunKey.resolve(run_key)
    mailbox = trusted_view(mailbox, key)
    run = read_run(mailbox)
    if run is None:
        raise ConfigError(f"{mailbox!r} holds no run (no {keys.RUN}); check the mailbox path or prefix")
    if run.key_id is not None and key is None:
        raise RunConfigMismatch(
            f"this run is signed with run key {run.key_id}: pass run_key= (or set {ENVIRONMENT_VARIABLE})"
        )
    compare_schemas(adapter.schema, run.schema)
    compare_frozen(frozen_of(adapter), run.frozen)
    newest = load_newest(mailbox, run)
    for _, arrays in newest.values():
        adapter.assign(arrays)
    return {q: version for q, (version, _) in newest.items()}
