"""A script re-run on the folder of an earlier run continues that run: joining it is a warning that says how
old the run is, how far it got and who trained in it, and resume=False refuses to continue it."""

import logging

import pytest

import slowlink as sl

from .nodes import batches, sgd_step, tiny_mlp

ALGORITHM = sl.DiLoCo(sync_every=2, overlap_steps=0)


def train(folder, steps=4, node_id="first", **options):
    model = tiny_mlp()
    with sl.Session(model, algorithm=ALGORITHM, mailbox=sl.DirMailbox(folder), node_id=node_id,
                    poll_seconds=0.005, **options) as session:  # fmt: skip
        for batch in batches(0, steps):
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
    return session


def listing(folder):
    return sorted((item.key, item.etag) for item in sl.DirMailbox(folder).list(""))


def test_joining_an_existing_run_is_a_warning_with_its_age_rounds_steps_and_nodes(tmp_path, caplog):
    train(tmp_path / "run", steps=4)
    caplog.set_level(logging.WARNING, logger="slowlink")
    events = []
    train(tmp_path / "run", steps=0, node_id="again", on_event=events.append)
    (joined,) = [e for e in events if e.kind == "joined"]
    assert [r.event for r in caplog.records if r.event.kind == "joined"] == [joined]  # at WARNING
    assert joined.data["versions"] == [2] and joined.data["steps"] == 4 and joined.data["nodes"] == ["first"]
    assert (
        joined.data["live_nodes"] == []
        and 0 <= joined.data["idle_seconds"] <= joined.data["age_seconds"] < 60
    )
    assert "continues it from its newest commit" in joined.message and "resume=False" in joined.message


def test_resume_false_refuses_a_run_with_commits_naming_the_mailbox_and_the_fix(tmp_path):
    train(tmp_path / "run")
    before = listing(tmp_path / "run")
    model = tiny_mlp()
    original = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(sl.ConfigError, match=r"resume=False, but DirMailbox\(.*run'\) holds run .* rounds \[2\]: "
                                             r"give this run a new folder or prefix, or pass resume=True"):  # fmt: skip
        sl.Session(model, algorithm=ALGORITHM, mailbox=tmp_path / "run", resume=False).start()
    assert listing(tmp_path / "run") == before
    assert all((a == b).all() for a, b in zip(model.parameters(), original, strict=True))


def test_resume_false_creates_a_fresh_run_and_joins_one_another_node_has_just_created(tmp_path):
    events = []
    with sl.Session(tiny_mlp(), algorithm=ALGORITHM, mailbox=tmp_path / "run", node_id="a", resume=False,
                    on_event=events.append):  # fmt: skip
        with sl.Session(tiny_mlp(), algorithm=ALGORITHM, mailbox=tmp_path / "run", node_id="b", resume=False,
                        on_event=events.append):  # fmt: skip
            pass
    assert [(e.node, e.kind) for e in events if e.kind in ("run_created", "joined")] == [
        ("a", "run_created"), ("b", "joined")]  # fmt: skip
    assert "no commit yet" in [e for e in events if e.kind == "joined"][0].message


def test_resume_must_be_a_bool():
    with pytest.raises(sl.ConfigError, match=r"resume='no' True or False"):
        sl.Session(tiny_mlp(), algorithm=ALGORITHM, mailbox=sl.MemoryMailbox(), resume="no")
