"""SlowlinkCallback drives a Session from transformers.Trainer: two real Trainer processes over a directory
end on the same committed model, learn, and count every sequence they trained; a Trainer resumed from its
checkpoint commits what it would have committed uninterrupted; importing slowlink never imports transformers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: nothing may be downloaded
pytest.importorskip("transformers", reason="the Trainer callback's tests need transformers (the dev extra)")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (the dev extra)")

import torch  # noqa: E402
from transformers import Trainer  # noqa: E402

import slowlink as sl  # noqa: E402
from slowlink.integrations.transformers import SlowlinkCallback  # noqa: E402

from .tiny_hf import ACCUMULATION, PER_DEVICE, build_model, dataset, digest, training_args  # noqa: E402

NODE = Path(__file__).with_name("trainer_node.py")
ROOT = Path(__file__).resolve().parents[2]
OFFLINE = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}" + os.environ.get("PYTHONPATH", ""),
}


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_two_trainer_processes_end_on_one_committed_model_learn_and_count_their_samples(tmp_path, arch):
    steps, nodes = 12, 2
    procs = []
    for node in range(nodes):
        args = {"arch": arch, "mailbox": str(tmp_path / "run"), "node": node, "nodes": nodes, "steps": steps,
                "sync_every": 4, "output_dir": str(tmp_path / f"out-{node}")}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, str(NODE), json.dumps(args), str(tmp_path / f"{node}.json")],
                                      env=OFFLINE))  # fmt: skip
    assert [proc.wait(timeout=240) for proc in procs] == [0] * nodes
    results = [json.loads((tmp_path / f"{node}.json").read_text()) for node in range(nodes)]

    committed = build_model(arch, seed=1)  # another initialization: align must replace every tensor
    versions = sl.align(committed, mailbox=tmp_path / "run")
    assert list(versions.values()) == [steps // 4]  # three rounds, each with both nodes (quorum 2)
    for result in results:
        assert result["versions"] == [steps // 4] and not result["open"]  # the callback left the run
        assert result["digest"] == digest(
            committed
        )  # each node ends holding the committed model, bit for bit
        assert result["step"] == steps
        assert result["samples"] == steps * PER_DEVICE * ACCUMULATION  # per device x accumulation x 1 process
        assert result["rejected"] == 0
        first, last = result["losses"][0], sum(result["losses"][-3:]) / 3
        assert last < first - 0.5, result["losses"]  # ln(48) = 3.9 at the start


ONE_NODE = sl.DiLoCo(sync_every=4, outer_lr=1.0, outer_momentum=0.0)


def train(tmp_path: Path, node_id: str, max_steps: int, *, resume: bool = False, events: list | None = None):
    """One node (quorum 1) trains a tiny GPT-2 with the Trainer in this process, syncing every 4 steps and
    saving every 3."""
    torch.set_num_threads(1)
    model = build_model("gpt2", seed=0 if not resume else 5)  # a restarted process's own initialization
    session = sl.Session(model, algorithm=ONE_NODE, mailbox=tmp_path / node_id / "run", node_id=node_id, poll_seconds=0.05,
                         on_event=events.append if events is not None else None)  # fmt: skip
    args = training_args(str(tmp_path / node_id / "out"), max_steps, save_strategy="steps", save_steps=3)
    trainer = Trainer(model=model, args=args, train_dataset=dataset(0), callbacks=[SlowlinkCallback(session)])
    trainer.train(resume_from_checkpoint=resume or None)
    return model, session, trainer


def test_a_trainer_resumed_from_its_checkpoint_commits_what_it_would_have_committed_uninterrupted(tmp_path):
    whole, whole_session, _ = train(tmp_path, "whole", 12)
    train(tmp_path, "split", 6)  # stops mid-round, after its checkpoint at step 6; a new process resumes:
    events: list[sl.Event] = []
    resumed, session, trainer = train(tmp_path, "split", 12, resume=True, events=events)

    loaded = [event.data["step"] for event in events if event.kind == "checkpoint_loaded"]
    assert loaded == [6]  # the node's place in the run came back from the Trainer's checkpoint-6 folder
    assert (tmp_path / "split" / "out" / "checkpoint-6" / "slowlink-split.safetensors").exists()
    assert session.stats.step == 12 and session.stats.samples == 12 * PER_DEVICE * ACCUMULATION
    assert whole_session.stats.versions == session.stats.versions == (3,)
    # The checkpoint's weights, loaded by the Trainer before the session joined, were not merged as training:
    # the committed model is the uninterrupted run's, to float32 sums in another order (1.03e-5 seen on one
    # bias, the losses equal to the last bit; merging the checkpoint's weights as training moves them ~1e-2).
    for (name, a), b in zip(whole.named_parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4, msg=name)
    resumed_steps = [
        entry["step"] for entry in trainer.state.log_history if "loss" in entry and entry["step"] > 6
    ]
    assert resumed_steps == [7, 8, 9, 10, 11, 12]  # the resumed Trainer trained steps 7-12


def test_a_session_entered_before_a_resuming_trainer_is_refused_with_the_fix(tmp_path):
    train(tmp_path, "node", 4)
    model = build_model("gpt2")
    args = training_args(str(tmp_path / "node" / "out"), 8)
    with sl.Session(model, algorithm=ONE_NODE, mailbox=tmp_path / "node" / "run", node_id="node") as session:
        trainer = Trainer(
            model=model, args=args, train_dataset=dataset(0), callbacks=[SlowlinkCallback(session)]
        )
        with pytest.raises(sl.SessionStateError, match="let SlowlinkCallback start it"):
            trainer.train(resume_from_checkpoint=True)
        assert session.stats.step == 0  # refused before any step was counted


def test_a_callback_for_another_model_is_refused_naming_the_fix(tmp_path):
    session = sl.Session(build_model("gpt2"), algorithm=sl.DiLoCo(sync_every=4), mailbox=tmp_path / "run")
    trainer = Trainer(model=build_model("gpt2"), args=training_args(str(tmp_path / "out"), 4),
                      train_dataset=dataset(0), callbacks=[SlowlinkCallback(session)])  # fmt: skip
    with pytest.raises(sl.ConfigError, match="same model object"):
        trainer.train()
    assert not session.is_open


def test_importing_slowlink_never_imports_transformers_and_its_absence_names_the_install():
    probe = (
        "import sys, slowlink, slowlink.integrations\n"
        "assert 'transformers' not in sys.modules, 'import slowlink imported transformers'\n"
        "sys.modules['transformers'] = None  # as if it were not installed\n"
        "try:\n"
        "    import slowlink.integrations.transformers\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=OFFLINE, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "pip install transformers" in done.stdout
