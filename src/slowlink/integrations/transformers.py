"""SlowlinkCallback: a Session driven by the Hugging Face `transformers.Trainer`, for a loop slowlink cannot
wrap in a `with` block. The callback joins the run when training begins, counts every optimizer step, saves
and loads the node's place in the run beside the Trainer's checkpoints, and leaves when training ends.

    session = sl.Session(model, algorithm=sl.DiLoCo(sync_every=100), mailbox="/shared/run-1", node_id="gpu-7")
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[SlowlinkCallback(session)])
    trainer.train()                               # or trainer.train(resume_from_checkpoint=True)
"""

import os
from pathlib import Path

try:
    from transformers import TrainerCallback
except ImportError as error:  # the library is an option of slowlink's, not a requirement
    raise ImportError(
        "slowlink.integrations.transformers needs the transformers library: pip install transformers accelerate"
    ) from error

from .. import checkpoint
from ..errors import ConfigError, SessionStateError
from ..events import Event
from ..frameworks.torch import unwrapped
from ..session import Session

CHECKPOINT_FILE = "slowlink-{node}.safetensors"  # inside the Trainer's checkpoint-<step> folder


class SlowlinkCallback(TrainerCallback):
    """Drives `session` from a `transformers.Trainer`: pass it in `callbacks=[SlowlinkCallback(session)]`.

    At train begin it starts the session (unless it is open already), after each optimizer step it calls
    session.step(samples=per-device batch x gradient accumulation x processes), and at train end it closes
    the session it started. With checkpoints=True (the default) every checkpoint the Trainer saves also
    holds this node's place in the run (slowlink-<node_id>.safetensors, see docs/checkpoints.md), and
    `trainer.train(resume_from_checkpoint=...)` resumes it: the Trainer loads its weights before the
    session joins, so they are never taken for training, and then the node's own unmerged steps are restored.
    """

    def __init__(self, session: Session, *, checkpoints: bool = True) -> None:
        if not isinstance(session, Session):
            raise ConfigError(f"SlowlinkCallback(session={session!r}) needs an sl.Session (not yet started)")
        self.session, self.checkpoints = session, checkpoints
        self._started_here = False

    def samples_per_step(self, args, state) -> int:
        """The sequences one optimizer step of this node trains on: the Trainer's total train batch size."""
        per_device = state.train_batch_size or args.per_device_train_batch_size
        return per_device * args.gradient_accumulation_steps * args.world_size

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if args.world_size > 1:
            raise ConfigError(
                f"SlowlinkCallback runs in one process per node, and this Trainer has {args.world_size} "
                "processes (torchrun or accelerate launch): start each node as one process"
            )
        _check_same_model(self.session, model)
        resumed = state.global_step > 0  # the Trainer has loaded a checkpoint's weights into the model
        if self.session.is_open and resumed:
            raise SessionStateError(
                "trainer.train(resume_from_checkpoint=...) loaded weights into a model that had already "
                "joined the run, where they would be merged as training: leave the session unstarted and "
                "let SlowlinkCallback start it (it joins after the Trainer has loaded the checkpoint)"
            )
        if not self.session.is_open:
            self.session.start()
            self._started_here = True
        if resumed and self.checkpoints:
            self._resume(args, state.global_step)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        # Called once per optimizer step, after the gradient accumulation steps of one update.
        self.session.step(samples=self.samples_per_step(args, state))
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.checkpoints and args.should_save:
            checkpoint.save(self._path(args, state.global_step), self.session)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._started_here:
            self.session.close()
        return control

    def _path(self, args, global_step: int) -> Path:
        folder = Path(args.output_dir) / f"checkpoint-{global_step}"  # the Trainer's name for it
        return folder / CHECKPOINT_FILE.format(node=self.session.node_id)

    def _resume(self, args, global_step: int) -> None:
        path = self._path(args, global_step)
        if path.exists():
            checkpoint.load(path, self.session)
            return
        session = self.session
        session.node.emit(Event(
            "checkpoint_missing", session.node_id,
            f"resumed the Trainer at step {global_step}, but {path} does not exist: this node starts from the "
            "run's newest commit, without the steps it had not yet merged (keep the node_id of the saving node)",
            {"step": global_step, "path": os.fspath(path)},
        ))  # fmt: skip


def _check_same_model(session: Session, model: object) -> None:
    """The Trainer must train the module the session synchronizes (or a wrapper around it)."""
    if model is not None and unwrapped(model) is not unwrapped(session.model):
        raise ConfigError(
            f"the Trainer trains a {type(model).__name__} that is not the model given to sl.Session: build "
            "the Session on the same model object you pass to Trainer(model=...)"
        )
