"""Run keys: every record of a signed run carries an HMAC-SHA256 signature; contributions that are unsigned,
signed with another key, or moved to another place are rejected with the reason, and nodes without the
run's key cannot join."""

import time

import numpy as np
import pytest
import torch

import slowlink as sl
from slowlink.protocol import contribution, keys, records
from slowlink.protocol.run import read_commit, read_head, read_run
from slowlink.protocol.trust import RunKey, Signed

from .nodes import batches, run_nodes, sgd_step, tiny_mlp
from .test_nothing_lost import raw_payload, shapes

KEY = "k" * 32
OTHER_KEY = "o" * 32


def signed_view(mailbox, key: str = KEY) -> Signed:
    """The store as a node with `key` sees it, bound to the run its run.json names (if any, and if valid)."""
    view = Signed(mailbox, RunKey(key))
    try:
        view.get(keys.RUN)
    except sl.PayloadError:
        pass
    return view


def signed_here(mailbox, key: str, body: bytes) -> bytes:
    """`body` signed with the run's key and bound to this mailbox's run, as its nodes sign it."""
    run_id = signed_view(mailbox).run_id
    return (
        RunKey(KEY).sign_payload(key, body, run_id)
        if key.endswith(".delta")
        else RunKey(KEY).sign(key, body, run_id)
    )


def test_a_signed_run_trains_and_every_record_in_the_store_is_signed():
    mailbox = sl.MemoryMailbox()
    algorithm = sl.DiLoCo(sync_every=2, quorum_size=2, overlap_steps=0)
    models, stats = run_nodes(2, algorithm, mailbox, 8, run_key=KEY)
    assert all(s.commits_applied == 4 and s.contributions_rejected == 0 for s in stats)
    record_keys = [item.key for item in mailbox.list("") if item.key.endswith(".json")]
    assert {key.split("/")[0] for key in record_keys} >= {"run.json", "head.json", "commits"}
    view = signed_view(mailbox)
    for key in record_keys:
        assert b'"signature":"' in mailbox.get(key).data
        view.get(key)  # verifies, or raises
    with pytest.raises(sl.PayloadError, match="signed with run key"):
        signed_view(mailbox, OTHER_KEY).get(keys.RUN)
    assert read_run(view).key_id == RunKey(KEY).key_id


def test_without_the_runs_key_a_node_cannot_join_and_its_model_is_untouched():
    mailbox = sl.MemoryMailbox()
    with sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=2), mailbox=mailbox, node_id="a", run_key=KEY):
        pass
    for run_key, error, named in (
        (None, sl.RunConfigMismatch, "run_key"),
        (OTHER_KEY, sl.PayloadError, "run key"),
    ):
        model = tiny_mlp(seed=7)
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(error, match=named):
            with sl.Session(
                model, algorithm=sl.DiLoCo(sync_every=2), mailbox=mailbox, node_id="b", run_key=run_key
            ):
                pass
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_node_with_a_key_refuses_an_unsigned_run():
    mailbox = sl.MemoryMailbox()
    with sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=2), mailbox=mailbox, node_id="a"):
        pass
    with pytest.raises(sl.PayloadError, match="unsigned"):
        with sl.Session(
            tiny_mlp(), algorithm=sl.DiLoCo(sync_every=2), mailbox=mailbox, node_id="b", run_key=KEY
        ):
            pass


def test_the_key_can_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("SLOWLINK_RUN_KEY", KEY)
    mailbox = sl.MemoryMailbox()
    with sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=2), mailbox=mailbox, node_id="a"):
        pass
    assert read_run(signed_view(mailbox)).key_id == RunKey(KEY).key_id


def test_a_short_key_is_refused_naming_how_to_make_one():
    with pytest.raises(sl.ConfigError, match="at least 16 bytes"):
        sl.Session(tiny_mlp(), algorithm=sl.DiLoCo(sync_every=2), mailbox=sl.MemoryMailbox(), run_key="short")


def plant(mailbox, node: str, write, *, round_: int = 1, at_round: int | None = None) -> None:
    """A contribution of zeros to fragment 0, which `write(mailbox, key, data)` stores as it likes."""
    run = read_run(signed_view(mailbox))
    arrays = {name: np.zeros(shape, np.float32) for name, shape in shapes(run).items()}
    claims = {"base": round_ - 1, "samples": 4, "steps": 2, "final": False, "step_seconds": 0.01, "norm": 0.0}
    data = raw_payload(arrays, contribution.header(run, 0, round_, node, claims))
    write(mailbox, keys.contribution(0, round_ if at_round is None else at_round, node), data)


FORGERIES = {
    "unsigned": (lambda mailbox, key, body: mailbox.put(key, body), "unsigned"),
    "signed with another key": (
        lambda mailbox, key, body: mailbox.put(
            key, RunKey(OTHER_KEY).sign_payload(key, body, signed_view(mailbox).run_id)
        ),
        "signed with run key",
    ),
    "altered after signing": (
        lambda mailbox, key, body: mailbox.put(
            key, signed_here(mailbox, key, body).replace(b'\\"samples\\":4', b'\\"samples\\":9')
        ),
        "forged signature",
    ),
    "moved to another round": (
        lambda mailbox, key, body: mailbox.put(
            key, signed_here(mailbox, keys.contribution(0, 7, "evil"), body)
        ),
        "forged signature",
    ),
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_contribution_that_is_not_signed_with_the_runs_key_is_rejected_with_the_reason(forgery):
    write, reason = FORGERIES[forgery]
    mailbox, events = sl.MemoryMailbox(), []
    model = tiny_mlp()
    with sl.Session(model, algorithm=sl.DiLoCo(sync_every=2, overlap_steps=0), mailbox=mailbox, node_id="good",
                    poll_seconds=0.005, on_event=events.append, run_key=KEY) as session:  # fmt: skip
        plant(mailbox, "evil", write)
        for batch in batches(0, 2):
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
        stats = session.stats
    record = read_commit(signed_view(mailbox), 0, 1)
    assert [c["node"] for c in record["contributors"]] == ["good"]
    assert record["rejected"][0]["node"] == "evil" and reason in record["rejected"][0]["reason"]
    assert stats.contributions_rejected == 1
    assert [e.data["from"] for e in events if e.kind == "contribution_rejected"] == ["evil"]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_align_checks_the_key_of_a_signed_run():
    mailbox = sl.MemoryMailbox()
    model = tiny_mlp()
    with sl.Session(model, algorithm=sl.DiLoCo(sync_every=1), mailbox=mailbox, node_id="a", run_key=KEY,
                    poll_seconds=0.005) as session:  # fmt: skip
        sgd_step(model, batches(0, 1)[0], 0.1)
        session.step(samples=4)
    with pytest.raises(sl.RunConfigMismatch, match="run_key"):
        sl.align(tiny_mlp(seed=2), mailbox=mailbox)
    with pytest.raises(sl.PayloadError, match="signed with run key"):
        sl.align(tiny_mlp(seed=2), mailbox=mailbox, run_key=OTHER_KEY)
    aligned = tiny_mlp(seed=2)
    assert sl.align(aligned, mailbox=mailbox, run_key=KEY) == {0: 1}
    assert all(torch.equal(a, b) for a, b in zip(aligned.parameters(), model.parameters(), strict=True))


def test_a_forged_leader_and_head_do_not_stop_a_signed_run():
    mailbox = sl.MemoryMailbox()
    model = tiny_mlp()

    def leader_is_signed_and_ours() -> bool:
        try:
            found = signed_view(mailbox).get(keys.LEADER)
        except sl.PayloadError:
            return False
        return records.decode(found.data, records.LEADER_FIELDS, what="leader")["node"] == "a"

    with sl.Session(model, algorithm=sl.DiLoCo(sync_every=2), mailbox=mailbox, node_id="a", run_key=KEY,
                    poll_seconds=0.005, lease_seconds=4.0) as session:  # fmt: skip
        data = batches(0, 2000)
        for step in range(2000):
            if step == 4:  # unsigned records, as someone with write access but not the key would write them
                mailbox.put(keys.LEADER, records.encode({"node": "evil", "term": 99, "beat": 1}))
                mailbox.put(keys.HEAD, records.encode({"versions": [0]}))
                forged_at = time.monotonic()
            sgd_step(model, data[step], 0.05)
            session.step(samples=4)
            if step > 4 and session.stats.versions[0] >= 6 and leader_is_signed_and_ours():
                break
            time.sleep(0.005)
        # The leader finds its record replaced at its next renewal, a quarter lease on, and takes it back
        # at once; meanwhile its create-once commits go on.
        assert time.monotonic() - forged_at < 4.0
        assert session.stats.is_leader and session.stats.versions[0] >= 6
    view = signed_view(mailbox)
    assert read_commit(view, 0, 6) is not None
    assert read_head(view, 1)[0][0] >= 6  # head.json signed again, rebuilt from the commits
