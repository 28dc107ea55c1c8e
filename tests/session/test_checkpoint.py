"""Checkpoints: a node killed and restarted from its checkpoint resumes its place in the run.

One node, outer lr 1, no momentum, quorum 1: each commit is then the node's own snapshot, so whatever the
timing of commits, the committed model after any round is plain local training's at that round's step. A
resumed node that loses a step, or counts its contribution in flight twice, or falls due at other steps, commits
something else. Two fragments, H = 6: fragment 0 syncs at steps 6, 12, 18, fragment 1 at 9 and 15.
"""

import copy
import functools
import os
import threading
import time

import pytest
import torch
from safetensors.numpy import save_file

import slowlink as sl
from slowlink.errors import MailboxUnavailable
from slowlink.protocol import keys
from slowlink.protocol.run import newest_versions, read_commit, read_head, read_run

from .nodes import batches, sgd_step, tiny_mlp

H, LR, STEPS = 6, 0.1, 18
# A node waits for its contribution TAU steps after it: its commits then land before the fragment is due again,
# so the steps each contribution holds do not depend on how fast the store is.
TAU = 4
BATCHES = batches(0, STEPS)
# (fragment, round) -> steps in that contribution, as an uninterrupted node sends them
UNINTERRUPTED_ROUNDS = {(0, 1): 6, (0, 2): 6, (0, 3): 6, (1, 1): 9, (1, 2): 6}


def algorithm(overlap_steps: int | None) -> sl.DiLoCo:
    return sl.DiLoCo(sync_every=H, fragments=2, outer_lr=1.0, outer_momentum=0.0, overlap_steps=overlap_steps)


class Gate:
    """A node's own door to the shared mailbox: it refuses writes under chosen prefixes, and, once cut, every
    request, as the store sees a node that was killed."""

    def __init__(self, inner) -> None:
        self.inner, self.refused, self.cut = inner, (), False
        self.on_read = None  # called with each key the training thread reads, before it is read

    def _check(self, key: str, write: bool) -> None:
        if self.cut or (write and key.startswith(self.refused)):
            raise MailboxUnavailable(f"gate: {key} refused")

    def put(self, key, data, *, if_absent=False, if_match=None):
        self._check(key, True)
        return self.inner.put(key, data, if_absent=if_absent, if_match=if_match)

    def get(self, key, *, if_none_match=None, max_bytes=None):
        self._check(key, False)
        if self.on_read is not None and threading.current_thread() is threading.main_thread():
            self.on_read(key)
        return self.inner.get(key, if_none_match=if_none_match, max_bytes=max_bytes)

    def list(self, prefix, *, start_after=None):
        self._check(prefix, False)
        return self.inner.list(prefix, start_after=start_after)

    def delete(self, keys_):
        for key in keys_:
            self._check(key, True)
        self.inner.delete(keys_)

    def clock(self):
        return self.inner.clock()


def node(model, mailbox, overlap_steps=TAU, name="a", events=None) -> sl.Session:
    return sl.Session(model, algorithm=algorithm(overlap_steps), mailbox=mailbox, node_id=name, poll_seconds=0.005,
                      lease_seconds=0.5, on_event=None if events is None else events.append)  # fmt: skip


def join(model, mailbox, overlap_steps=TAU) -> sl.Session:
    """Enter a session without a `with`: a node that is killed never leaves."""
    return node(model, mailbox, overlap_steps).__enter__()


def crash(session: sl.Session, gate: Gate) -> None:
    """Kill the node: it reaches nothing more and trains no more; what it left in the store stays there."""
    gate.cut = True
    session.courier.stop()  # ends its thread; the goodbye to the store is refused like everything else


def train(session, model, start, stop, optimizer=None) -> None:
    for t in range(start, stop):
        local_step(model, t, optimizer)
        session.step(samples=4)


def local_step(model, t, optimizer=None) -> None:
    if optimizer is None:
        sgd_step(model, BATCHES[t], LR)
        return
    x, y = BATCHES[t]
    optimizer.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    optimizer.step()


def adam_for(model) -> torch.optim.Adam:
    return torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.95))


@functools.cache
def reference(steps: int, adam: bool = False) -> dict[str, torch.Tensor]:
    """The parameters after `steps` steps of plain local training: what the run commits at that step."""
    model = tiny_mlp()
    optimizer = adam_for(model) if adam else None
    for t in range(steps):
        local_step(model, t, optimizer)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def params(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def assert_params(actual: dict, expected: dict, names=None) -> None:
    for name in names or expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-6, rtol=0, msg=name)


def committed(mailbox) -> dict[str, torch.Tensor]:
    evaluator = tiny_mlp(seed=9)
    sl.align(evaluator, mailbox=mailbox)
    return params(evaluator)


def assert_like_an_uninterrupted_node(mailbox, plan, adam=False) -> None:
    """Fragment 0's newest commit is round 3 (step 18), fragment 1's round 2 (step 15), each contribution
    holding the steps an uninterrupted node sends."""
    assert read_head(mailbox, 2)[0] == [3, 2]
    model = committed(mailbox)
    assert_params(model, reference(18, adam), plan[0])
    assert_params(model, reference(15, adam), plan[1])
    for (fragment, round_), steps in UNINTERRUPTED_ROUNDS.items():
        contributors = read_commit(mailbox, fragment, round_)["contributors"]
        assert [(c["node"], c["steps"], c["samples"]) for c in contributors] == [("a", steps, 4 * steps)]


def wait_for(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def resume_and_finish(mailbox, path, overlap_steps, expect_step, *, refused=()):
    """A new process of node "a": join, load, check the model is where the checkpoint was, train to the end.
    `refused` holds back its writes under those prefixes until it has loaded."""
    model, gate = tiny_mlp(seed=5), Gate(mailbox)  # any start: joining loads the run's model
    gate.refused = refused
    with node(model, gate, overlap_steps) as session:
        start = sl.checkpoint.load(path, session)
        assert start == expect_step
        assert_params(params(model), reference(start))
        gate.refused = ()
        train(session, model, start, STEPS)


def test_a_node_resumed_with_nothing_in_flight_commits_what_an_uninterrupted_node_commits(tmp_path):
    mailbox, path = sl.MemoryMailbox(), tmp_path / "a.ckpt"
    model, gate = tiny_mlp(), Gate(mailbox)
    a = join(model, gate, overlap_steps=0)  # a barrier: after each sync step its round is committed
    train(a, model, 0, 10)
    sl.checkpoint.save(path, a)
    local_step(model, 10)  # trained but never counted: lost with the crash, trained again after it
    crash(a, gate)
    resume_and_finish(mailbox, path, 0, expect_step=10)
    assert_like_an_uninterrupted_node(mailbox, a.plan)


def test_a_contribution_in_flight_at_the_save_and_committed_before_the_restart_is_not_counted_twice(tmp_path):
    mailbox, path = sl.MemoryMailbox(), tmp_path / "a.ckpt"
    model, gate = tiny_mlp(), Gate(mailbox)
    gate.refused = ("commits/",)  # round 1 of fragment 0 goes out at step 6, but cannot commit yet
    a = join(model, gate)
    train(a, model, 0, 8)
    sl.checkpoint.save(path, a)  # fragment 0's contribution is in flight, two steps behind
    gate.refused = ()
    wait_for(lambda: newest_versions(mailbox, 2)[0] == 1, "round 1 of fragment 0")
    crash(a, gate)  # the commit was never applied by the node
    resume_and_finish(mailbox, path, TAU, expect_step=8)
    assert_like_an_uninterrupted_node(mailbox, a.plan)


def test_a_contribution_in_flight_whose_round_is_still_open_at_the_restart_is_merged_once(tmp_path):
    mailbox, path = sl.DirMailbox(tmp_path / "run"), tmp_path / "a.ckpt"
    model, gate = tiny_mlp(), Gate(mailbox)
    gate.refused = ("commits/",)
    a = join(model, gate)
    train(a, model, 0, 8)
    sl.checkpoint.save(path, a)
    crash(a, gate)
    assert read_commit(mailbox, 0, 1) is None and mailbox.get(keys.contribution(0, 1, "a")) is not None
    # The new process holds its commits back until it has loaded, so the round commits with it watching.
    resume_and_finish(mailbox, path, TAU, expect_step=8, refused=("commits/",))
    assert_like_an_uninterrupted_node(mailbox, a.plan)


def test_a_round_that_commits_while_the_checkpoint_loads_still_counts_its_contribution_once(tmp_path):
    mailbox, path = sl.MemoryMailbox(), tmp_path / "a.ckpt"
    model, gate = tiny_mlp(), Gate(mailbox)
    gate.refused = ("commits/",)
    a = join(model, gate)
    train(a, model, 0, 8)
    sl.checkpoint.save(path, a)
    crash(a, gate)
    model, gate = tiny_mlp(seed=5), Gate(mailbox)
    gate.refused = ("commits/",)
    with node(model, gate) as session:

        def commit_meanwhile(key):
            # Loading has just found round 1 open: now it commits, and the communication thread fetches it
            # before it can know that the contribution in it is this node's.
            if key == keys.contribution(0, 1, "a"):
                gate.refused = ()
                wait_for(lambda: session.courier.latest[0][0] == 1, "the commit of round 1 to be fetched")

        gate.on_read = commit_meanwhile
        assert sl.checkpoint.load(path, session) == 8
        gate.on_read = None
        assert_params(params(model), reference(8))
        train(session, model, 8, STEPS)
    assert_like_an_uninterrupted_node(mailbox, a.plan)


def test_a_contribution_that_never_reached_the_store_is_sent_again_after_the_restart(tmp_path):
    mailbox, path = sl.MemoryMailbox(), tmp_path / "a.ckpt"
    model, gate = tiny_mlp(), Gate(mailbox)
    gate.refused = ("rounds/", "commits/")
    a = join(model, gate)
    train(a, model, 0, 6)
    sl.checkpoint.save(path, a)  # right after the sync step: the snapshot is the checkpoint's own state
    crash(a, gate)
    assert mailbox.get(keys.contribution(0, 1, "a")) is None
    resume_and_finish(mailbox, path, TAU, expect_step=6, refused=("commits/",))
    assert_like_an_uninterrupted_node(mailbox, a.plan)


def test_a_contribution_in_flight_whose_round_committed_without_it_is_carried_into_the_next(tmp_path):
    mailbox, path = sl.MemoryMailbox(), tmp_path / "a.ckpt"
    model, gate = tiny_mlp(), Gate(mailbox)
    gate.refused = ("rounds/", "commits/")  # node a's round 1 never arrives (nor, as it leads, its commit)
    a = join(model, gate)
    train(a, model, 0, 6)
    saved = params(model)
    sl.checkpoint.save(path, a)
    crash(a, gate)
    other = tiny_mlp()  # node b closes round 1 of fragment 0 alone, once a's lease and leadership lapse
    with node(other, mailbox, name="b") as b:
        for batch in batches(1, 6):
            sgd_step(other, batch, LR)
            b.step(samples=4)
    assert [c["node"] for c in read_commit(mailbox, 0, 1)["contributors"]] == ["b"]
    round_1, initial = committed(mailbox), params(tiny_mlp())
    model = tiny_mlp(seed=5)
    with node(model, mailbox) as session:
        assert sl.checkpoint.load(path, session) == 6
        # θ ← Θ_1 − Δ_local on fragment 0: its 6 steps were not merged, so all of them are kept.
        expected = {name: round_1[name] - (initial[name] - saved[name]) for name in saved}
        assert_params(params(model), expected)
        train(session, model, 6, 12)
    # The next contribution of fragment 0 holds round 1's steps and the 6 since: 12 steps, 48 samples.
    contributors = read_commit(mailbox, 0, 2)["contributors"]
    assert [(c["node"], c["steps"], c["samples"]) for c in contributors] == [("a", 12, 48)]


def test_a_checkpoint_older_than_a_committed_contribution_takes_the_run_s_word_for_its_progress(tmp_path):
    mailbox, path, events = sl.MemoryMailbox(), tmp_path / "a.ckpt", []
    model, gate = tiny_mlp(), Gate(mailbox)
    a = join(model, gate, overlap_steps=0)
    train(a, model, 0, 10)
    sl.checkpoint.save(path, a)
    train(a, model, 10, 12)  # round 2 of fragment 0 commits at step 12, after the save
    crash(a, gate)
    model = tiny_mlp(seed=5)
    with node(model, mailbox, overlap_steps=0, events=events) as session:
        assert sl.checkpoint.load(path, session) == 10
        # Fragment 0 is round 2 itself (its steps up to 10 are in it), fragment 1 where the checkpoint left it.
        assert_params(params(model), reference(12), session.plan[0])
        assert_params(params(model), reference(10), session.plan[1])
        train(session, model, 10, 12)
    behind = [e.data for e in events if e.kind == "checkpoint_behind"]
    assert behind == [{"fragment": 0, "round": 2, "steps": 2}]
    # Steps 11 and 12, trained again, go into round 3, at the step the node's schedule had it due.
    assert [(c["node"], c["steps"]) for c in read_commit(mailbox, 0, 3)["contributors"]] == [("a", 2)]


def test_a_contribution_published_after_the_save_and_still_open_is_taken_as_the_one_in_flight(tmp_path):
    mailbox, path, events = sl.MemoryMailbox(), tmp_path / "a.ckpt", []
    model, gate = tiny_mlp(), Gate(mailbox)
    a = join(model, gate, overlap_steps=2)  # fragment 0's round 1 is applied by step 8
    train(a, model, 0, 10)
    sl.checkpoint.save(path, a)
    gate.refused = ("commits/0000/",)
    train(a, model, 10, 12)  # round 2 of fragment 0 goes out at step 12 and cannot commit
    # Node a merges, so it keeps its contribution in memory; it writes it to the store when asked, as a
    # checkpoint saved a step later would ask it.
    wait_for(lambda: (0, 2) in a.courier.merger.own.kept, "round 2's contribution")
    a.courier.merger.own.wanted.set()
    wait_for(lambda: mailbox.get(keys.contribution(0, 2, "a")) is not None, "round 2's contribution stored")
    crash(a, gate)
    model, gate = tiny_mlp(seed=5), Gate(mailbox)
    gate.refused = ("commits/",)  # the new process commits round 2 only once it has loaded
    with node(model, gate, overlap_steps=2, events=events) as session:
        assert sl.checkpoint.load(path, session) == 10
        assert_params(params(model), reference(10))
        gate.refused = ()
        wait_for(lambda: read_commit(mailbox, 0, 2) is not None, "round 2 of fragment 0")
    # Round 2 holds the checkpoint's 4 steps of fragment 0: none of them is left to send on leaving (had
    # they been carried, 4 would be), only fragment 1's step 10.
    assert session.stats.steps_dropped == 1
    assert [(c["node"], c["steps"]) for c in read_commit(mailbox, 0, 2)["contributors"]] == [("a", 6)]
    assert [e.data for e in events if e.kind == "checkpoint_behind"] == [
        {"fragment": 0, "round": 2, "steps": 2}
    ]
    assert_params(params(model), reference(12), session.plan[0])  # leaving aligns with the newest commits


def test_adam_state_round_trips_exactly_and_the_resumed_run_matches_an_uninterrupted_one(tmp_path):
    mailbox, path = sl.MemoryMailbox(), tmp_path / "a.ckpt"
    model, gate = tiny_mlp(), Gate(mailbox)
    optimizer = adam_for(model)
    a = join(model, gate, overlap_steps=0)
    train(a, model, 0, 10, optimizer)
    sl.checkpoint.save(path, a, optimizer)
    saved = copy.deepcopy(optimizer.state_dict())
    crash(a, gate)

    model = tiny_mlp(seed=5)
    fresh = adam_for(model)
    with node(model, mailbox, overlap_steps=0) as session:
        assert sl.checkpoint.load(path, session, fresh) == 10
        restored = fresh.state_dict()
        assert restored["param_groups"] == saved["param_groups"]
        assert isinstance(restored["param_groups"][0]["betas"], tuple)
        assert restored["state"].keys() == saved["state"].keys() == set(range(4))
        for index, state in saved["state"].items():
            assert state.keys() == restored["state"][index].keys() == {"step", "exp_avg", "exp_avg_sq"}
            for key, value in state.items():
                assert torch.equal(restored["state"][index][key], value), (index, key)
        train(session, model, 10, STEPS, fresh)
    assert_like_an_uninterrupted_node(mailbox, a.plan, adam=True)


@pytest.fixture
def saved_checkpoint(tmp_path):
    """A checkpoint of node "a" at step 4 with Adam state, and the mailbox of its run."""
    mailbox, path = sl.MemoryMailbox(), tmp_path / "a.ckpt"
    model = tiny_mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with node(model, mailbox, overlap_steps=0) as session:
        train(session, model, 0, 4, optimizer)
        sl.checkpoint.save(path, session, optimizer)
    return mailbox, path


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 10])


def not_a_checkpoint(path):
    import numpy as np

    save_file({"x": np.zeros(3, np.float32)}, path, metadata={"format": "something-else"})


@pytest.mark.parametrize(
    ("damage", "error", "words"),
    [
        (truncate, sl.PayloadError, "damaged or truncated"),
        (lambda path: path.write_bytes(b"\x00" * 64), sl.PayloadError, "damaged or truncated"),
        (not_a_checkpoint, sl.PayloadError, "not a slowlink checkpoint"),
    ],
)
def test_a_damaged_file_is_refused_and_changes_nothing(saved_checkpoint, damage, error, words):
    mailbox, path = saved_checkpoint
    damage(path)
    model = tiny_mlp(seed=5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with node(model, mailbox, overlap_steps=0) as session:
        before = params(model)
        with pytest.raises(error, match=words):
            sl.checkpoint.load(path, session, optimizer)
        assert_params(params(model), before)
        assert optimizer.state_dict()["state"] == {} and session.stats.step == 0


def test_a_checkpoint_of_another_run_is_refused_naming_both_runs_and_the_fix(saved_checkpoint):
    mailbox, path = saved_checkpoint
    model = tiny_mlp(seed=5)
    with node(model, sl.MemoryMailbox(), overlap_steps=0) as session:
        before = params(model)
        with pytest.raises(sl.ConfigError, match="a checkpoint resumes a node only in its own run") as raised:
            sl.checkpoint.load(path, session)
        assert_params(params(model), before)
    assert read_run(mailbox).run_id in str(raised.value) and session.run.run_id in str(raised.value)


def test_a_checkpoint_of_another_node_or_model_is_refused_naming_it(saved_checkpoint):
    mailbox, path = saved_checkpoint
    with node(tiny_mlp(seed=5), mailbox, overlap_steps=0, name="z") as session:
        with pytest.raises(
            sl.ConfigError, match="holds node 'a', but this session is node 'z': pass node_id='a'"
        ):
            sl.checkpoint.load(path, session)
    wide = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    with node(wide, sl.MemoryMailbox(), overlap_steps=0) as session:
        with pytest.raises(sl.SchemaMismatch, match=r"'0.weight' has shape \(5, 3\) here but \(4, 3\)"):
            sl.checkpoint.load(path, session)


@pytest.mark.parametrize(
    ("make_optimizer", "words"),
    [
        (lambda model: torch.optim.SGD(model.parameters(), lr=0.1), "state of a Adam optimizer"),
        (
            lambda model: torch.optim.Adam(list(model.parameters())[:2], lr=0.01),
            r"sizes \[4\]; this one has \[2\]",
        ),
        (lambda model: torch.optim.Adam(reversed(list(model.parameters())), lr=0.01), "parameter 2.bias"),
    ],
)
def test_an_optimizer_built_otherwise_is_refused_and_keeps_its_state(saved_checkpoint, make_optimizer, words):
    mailbox, path = saved_checkpoint
    model = tiny_mlp(seed=5)
    optimizer = make_optimizer(model)
    with node(model, mailbox, overlap_steps=0) as session:
        before = params(model)
        with pytest.raises(sl.ConfigError, match=words):
            sl.checkpoint.load(path, session, optimizer)
        assert_params(params(model), before)
        assert optimizer.state_dict()["state"] == {} and session.stats.step == 0


def test_load_needs_a_session_that_has_not_stepped(saved_checkpoint):
    mailbox, path = saved_checkpoint
    model = tiny_mlp(seed=5)
    with node(model, mailbox, overlap_steps=0) as session:
        train(session, model, 0, 1)
        with pytest.raises(sl.SessionStateError, match="before the first session.step"):
            sl.checkpoint.load(path, session)


def test_a_save_that_fails_before_its_rename_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    mailbox, path = sl.MemoryMailbox(), tmp_path / "a.ckpt"
    model = tiny_mlp()
    with node(model, mailbox, overlap_steps=0) as session:
        train(session, model, 0, 3)
        sl.checkpoint.save(path, session)
        train(session, model, 3, 5)

        def killed(*args):
            raise OSError("killed mid-save")

        monkeypatch.setattr(os, "replace", killed)
        with pytest.raises(OSError, match="killed mid-save"):
            sl.checkpoint.save(path, session)
        monkeypatch.undo()
    assert os.listdir(tmp_path) == ["a.ckpt"]  # no temporary file left behind
    with node(tiny_mlp(seed=5), mailbox, overlap_steps=0) as session:
        assert sl.checkpoint.load(path, session) == 3


def test_save_waits_for_an_upload_at_most_upload_timeout_then_writes_nothing(tmp_path):
    mailbox, path = sl.MemoryMailbox(), tmp_path / "a.ckpt"
    model, gate = tiny_mlp(), Gate(mailbox)
    # fragment 0's contribution at step 6 cannot be uploaded, nor, as node a leads, merged by it
    gate.refused = ("rounds/", "commits/")
    a = join(model, gate)
    train(a, model, 0, 7)
    with pytest.raises(MailboxUnavailable, match="upload_timeout=0.05s; no checkpoint was written"):
        sl.checkpoint.save(path, a, upload_timeout=0.05)
    assert not path.exists()
    crash(a, gate)
