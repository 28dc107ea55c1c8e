"""The checkpoint file: one safetensors file, arrays as entries and the rest as JSON in its metadata, written
atomically; reading it checks everything against the session before anyone uses it."""

import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ..arrays import Arrays
from ..errors import ConfigError, PayloadError
from ..frameworks.base import compare_schemas, local_of
from ..protocol import records
from ..session import Session

FORMAT = "slowlink-checkpoint-1"

HEADER_FIELDS = {"run": str, "node": str, "schema": list, "step": int, "samples": int, "schedule_step": int,
                 "owed": list, "fragments": list}  # fmt: skip
FRAGMENT_FIELDS = {"anchor": int, "pending_steps": int, "pending_samples": int, "residual": bool}
FLIGHT_FIELDS = {"round": int, "snapshot_step": int, "steps": int, "samples": int, "delta": str,
                 "residual": bool, "blob": (str, type(None))}  # fmt: skip


def write_atomically(path: Path, arrays: Arrays, tensors: dict, metadata: dict[str, str]) -> None:
    """Write beside `path`, flush to disk, then rename over it: readers see the old file or the new one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if any(not isinstance(values, np.ndarray) for values in tensors.values()):  # torch tensors among them
            import torch
            from safetensors.torch import save_file as save_torch

            entries = {**arrays, **tensors}
            save_torch({key: torch.from_numpy(values) if isinstance(values, np.ndarray) else values
                        for key, values in entries.items()}, temporary, metadata=metadata)  # fmt: skip
        else:
            save_file({**arrays, **tensors}, temporary, metadata=metadata)
        with open(temporary, "rb+") as written:
            os.fsync(written.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    try:  # the rename itself survives a power cut once the directory is synced (POSIX only)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError:
        pass


def read(path: Path) -> tuple[dict, Arrays]:
    """The header and this node's arrays (not the optimizer's); PayloadError for anything but a well-formed
    checkpoint. A missing file raises FileNotFoundError."""
    damaged = "; it is damaged or truncated: use an earlier checkpoint, or start the node without one"
    try:
        with safe_open(path, framework="numpy") as opened:
            metadata = opened.metadata() or {}
            if metadata.get("format") != FORMAT or "checkpoint" not in metadata:
                raise PayloadError(f"{path} is not a slowlink checkpoint (format {metadata.get('format')!r}, "
                                   f"expected {FORMAT!r})")  # fmt: skip
            names = [key for key in opened.keys() if not key.startswith(("optimizer/", "extra/"))]  # noqa: SIM118
            arrays = {key: opened.get_tensor(key) for key in names}
    except SafetensorError as error:
        raise PayloadError(f"{path} cannot be read ({error}){damaged}") from None
    try:
        header = records.decode(metadata["checkpoint"].encode(), HEADER_FIELDS, what=str(path))
        if not all(map(is_tensor_spec, header["schema"])) or not all(map(is_count, header["owed"])):
            raise PayloadError(f"{path} holds a malformed schema or schedule")
        for q, entry in enumerate(header["fragments"]):
            check_fields(entry, FRAGMENT_FIELDS, f"{path} fragment {q}")
            flight = entry["in_flight"]
            if flight is not None:
                check_fields(flight, FLIGHT_FIELDS, f"{path} fragment {q}'s contribution in flight")
                if flight["round"] != entry["anchor"] + 1 or flight["delta"] not in ("local", "stored"):
                    raise PayloadError(f"{path} fragment {q}'s contribution in flight is malformed")
    except PayloadError as error:
        raise PayloadError(f"{error}{damaged}") from None
    return header, arrays


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_tensor_spec(spec: object) -> bool:
    return (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str) and isinstance(spec[2], str)
            and isinstance(spec[1], list) and all(isinstance(n, int) for n in spec[1]))  # fmt: skip


def check_fields(entry: object, fields: dict, what: str) -> None:
    if not isinstance(entry, dict):
        raise PayloadError(f"{what} is not a JSON object")
    for name, kind in fields.items():
        value = entry.get(name)
        if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 0)):
            raise PayloadError(f"{what} field {name!r} is {value!r}, expected {kind}")


def check_identity(path: Path, header: dict, session: Session) -> None:
    schema = [(name, tuple(shape), dtype) for name, shape, dtype in header["schema"]]
    compare_schemas(session.adapter.schema, schema)  # SchemaMismatch naming the first tensor that differs
    if header["run"] != session.run.run_id:
        raise ConfigError(
            f"{path} was saved in run {header['run']}, but this session joined run {session.run.run_id}: a "
            "checkpoint resumes a node only in its own run. Open the session on the mailbox it was saved "
            "from, or start this node without the checkpoint (it then trains from the run's newest commit)"
        )
    if header["node"] != session.node_id:
        raise ConfigError(
            f"{path} holds node {header['node']!r}, but this session is node {session.node_id!r}: pass "
            f"node_id={header['node']!r} to sl.Session to resume that node"
        )
    fragments = len(session.plan)
    if len(header["fragments"]) != fragments or not set(header["owed"]) <= set(range(fragments)):
        raise PayloadError(f"{path} holds {len(header['fragments'])} fragments; the run has {fragments}")
    for q, entry in enumerate(header["fragments"]):
        held = session.node.anchors[q][0]
        if entry["anchor"] > held:
            raise ConfigError(
                f"{path} anchors fragment {q} at round {entry['anchor']}, but the run's newest commit of it is "
                f"round {held}: the mailbox was rolled back since the save. Start this node without the checkpoint"
            )


def check_arrays(path: Path, header: dict, arrays: Arrays, session: Session) -> None:
    check_own(path, {key: values for key, values in arrays.items() if key.startswith("own/")}, session)
    arrays = {key: values for key, values in arrays.items() if not key.startswith("own/")}
    shapes = {name: shape for name, shape, _ in session.adapter.schema}
    expected = {}
    for q, (names, entry) in enumerate(zip(session.plan, header["fragments"], strict=True)):
        flight = entry["in_flight"]
        kinds = ["local"] + ["residual"] * entry["residual"]
        if flight is not None:
            kinds += ["in_flight"] * (flight["delta"] == "stored")
            kinds += ["in_flight_residual"] * flight["residual"]
        expected.update({f"{kind}/{q}/{name}": shapes[name] for kind in kinds for name in names})
    if set(arrays) != set(expected):
        raise PayloadError(f"{path} holds arrays {sorted(set(arrays) ^ set(expected))[:4]} out of place; "
                           "it was not written by sl.checkpoint.save for this run")  # fmt: skip
    for key, values in arrays.items():
        if values.dtype != np.float32 or values.shape != tuple(expected[key]):
            raise PayloadError(f"{path} entry {key!r} is {values.dtype}{list(values.shape)}, expected "
                               f"float32{list(expected[key])}")  # fmt: skip
        if not np.isfinite(values).all():
            raise PayloadError(
                f"{path} entry {key!r} holds NaN or infinite values; use an earlier checkpoint"
            )


def check_own(path: Path, arrays: Arrays, session: Session) -> None:
    """The node's own tensors (`own/<name>`) are exactly this model's, each in its dtype and shape."""
    expected = {f"own/{name}": values for name, values in local_of(session.adapter).items()}
    if set(arrays) != set(expected):
        raise PayloadError(f"{path} holds the node's own tensors {sorted(arrays)[:4]}, but this model keeps "
                           f"{sorted(expected)[:4]}: it was saved from another model or choice of params=")  # fmt: skip
    for key, values in arrays.items():
        if values.dtype != expected[key].dtype or values.shape != expected[key].shape:
            raise PayloadError(f"{path} entry {key!r} is {values.dtype}{list(values.shape)}, expected "
                               f"{expected[key].dtype}{list(expected[key].shape)}")  # fmt: skip
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            raise PayloadError(
                f"{path} entry {key!r} holds NaN or infinite values; use an earlier checkpoint"
            )
