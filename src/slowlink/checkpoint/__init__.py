"""Checkpoints: a node saves its place in the run, and resumes there after a restart instead of starting over.

A checkpoint is one safetensors file (never pickle): arrays as entries, everything else as JSON in its
metadata. Per fragment q it holds the local progress since the anchor commit a, Δ_local = Θ_a − θ, the steps
and samples not yet sent, and the contribution in flight, if any: its round r = a+1, steps, samples and
Δ_F = Θ_a − θ_snapshot. Also the node's step, samples and schedule, error-feedback residuals, and the
optimizer's state_dict. A freshly joined session holds the newest commit Θ_v; loading sets θ ← Θ_v − Δ_resume:
    r committed with this node:     Δ_resume = Δ_local − Δ_F      (it is merged; counting it again doubles it)
    r committed without it:         Δ_resume = Δ_local            (F's steps go into the next contribution)
    r open:                         Δ_resume = Δ_local, F stays in flight (sent again if it never arrived)
A contribution this node published after the save holds all of Δ_resume: when one is committed, Δ_resume = 0;
when its round is open, it becomes the contribution in flight. Those are the limits: the steps trained after
the save are trained again, and the ones the run already holds count twice (event "checkpoint_behind").
With `mixing`, a merged F's overlap steps are carried rather than blended. See docs/checkpoints.md.
"""

import json
import os
from pathlib import Path

from ..errors import ConfigError, SessionStateError
from ..events import Event
from ..session import Session
from .capture import capture
from .extra import check_readable, extra_from_file, extra_to_json
from .file import FORMAT, check_arrays, check_identity, read, write_atomically
from .optimizer import optimizer_from_file, optimizer_to_json
from .resume import apply, plan_fragment

__all__ = ["load", "save"]


def save(path: str | os.PathLike, session: Session, optimizer: object = None, *, extra: dict | None = None,
         upload_timeout: float = 300.0) -> None:  # fmt: skip
    """Write `session`'s place in the run and `optimizer`'s state to `path`, atomically: a crash mid-save
    leaves the previous file. Call it between steps, right after session.step(). A contribution still being
    uploaded is waited for, at most `upload_timeout` seconds (MailboxUnavailable after, nothing written).
    extra: the rest of the training state, in the same file: a dict of state_dicts, RNG states, counters
    (tensors, numpy arrays, numbers, strings, lists, tuples, dicts; never pickled), which load returns."""
    if not session.is_open:
        raise SessionStateError("sl.checkpoint.save needs an open session: call it inside its `with` block")
    tensors: dict = {}
    encoded_extra = None if extra is None else extra_to_json(extra, tensors)  # refused before anything waits
    header, arrays = capture(session, upload_timeout)
    header["optimizer"] = None if optimizer is None else optimizer_to_json(optimizer, tensors)
    header["extra"] = encoded_extra
    text = json.dumps(header)
    if extra:
        check_readable(text)
    write_atomically(Path(path), arrays, tensors, {"format": FORMAT, "checkpoint": text})
    session.node.emit(Event("checkpoint_saved", session.node_id, f"saved step {header['step']} to {path}",
                        {"step": header["step"], "path": str(path)}))  # fmt: skip


def load(path: str | os.PathLike, session: Session, optimizer: object = None, *, extra: bool = False):
    """Resume the node saved in `path` in `session`, freshly entered and not yet stepped; restore `optimizer`'s
    state too. Returns the number of steps the node had trained: continue the training loop from there; with
    extra=True, (steps, the `extra` dict given to save, {} if none). A file of another run, node, model or
    optimizer is refused, and then nothing changes."""
    if not session.is_open or session.node.state.step or session.node.state.in_flight():
        raise SessionStateError("sl.checkpoint.load needs a session that has not stepped yet: call it right "
                                "after entering `with sl.Session(...)`, before the first session.step()")  # fmt: skip
    path = Path(path)
    header, arrays = read(path)
    check_identity(path, header, session)
    check_arrays(path, header, arrays, session)
    state = None if optimizer is None else optimizer_from_file(path, header, optimizer, session)
    saved_extra = extra_from_file(path, header.get("extra")) if extra else None
    resumes = [
        plan_fragment(session, q, entry, arrays, header["step"])
        for q, entry in enumerate(header["fragments"])
    ]
    if state is not None:
        try:
            optimizer.load_state_dict(state)
        except (ValueError, KeyError, TypeError) as error:
            raise ConfigError(f"{path}: the optimizer refused the saved state ({error}); build it as the "
                              "saved one was, or pass optimizer=None to start it afresh") from None  # fmt: skip
    apply(session, header, resumes)
    own = {key.removeprefix("own/"): values for key, values in arrays.items() if key.startswith("own/")}
    if own:  # integer buffers and whatever params= leaves out: the node's, not the run's
        session.adapter.load_local_state(own)
    return (header["step"], saved_extra) if extra else header["step"]
