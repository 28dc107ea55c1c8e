"""The outer state is written with one commit in OUTER_EVERY and the others name it: a merger taking over
carries on from the state the newest commit names, and writes its own with its first commit. One parameter,
computed by hand."""

import numpy as np

from slowlink.algorithms.diloco import DiLoCo
from slowlink.mailbox.memory import MemoryMailbox
from slowlink.protocol.commits import OUTER_EVERY
from slowlink.protocol.merger import Merger
from slowlink.protocol.run import open_run, read_commit

from .test_merger_retry import contribute


def test_a_new_merger_carries_on_from_the_outer_state_the_newest_commit_names():
    # Outer Nesterov with η = 1, μ = 0.5 and Δ = 1 every round: b_r = μ·b_(r−1) + 1 = 2 − 2^(1−r), and
    # θ_r = θ_(r−1) − (1 + μ·b_r).
    algorithm = DiLoCo(sync_every=10, outer_lr=1.0, outer_momentum=0.5)
    mailbox = MemoryMailbox()
    run, _ = open_run(mailbox, config=algorithm.to_dict(), schema=[("w", (1,), "float32")],
                      schema_digest="0" * 64, plan=[["w"]], initial=lambda: [{"w": np.zeros(1, np.float32)}])  # fmt: skip
    live = lambda fresh: {"n"}  # noqa: E731
    first = Merger(mailbox, run, algorithm, "m", emit=lambda event: None, clock=lambda: 0.0)
    first.looks.look_seconds = 0.0
    params, last = {"w": np.zeros(1, np.float32)}, OUTER_EVERY + 2
    for round_ in range(1, last + 1):
        contribute(mailbox, run, round_, 1.0)
        [committed] = first.step({0: (round_ - 1, params)}, live, [round_ - 1])
        params = committed.params
    records = [read_commit(mailbox, 0, round_) for round_ in range(1, last + 1)]
    assert [r["round"] for r in records if "outer_round" not in r] == [1, OUTER_EVERY + 1]
    assert [r.get("outer_round") for r in records[-2:]] == [None, OUTER_EVERY + 1]
    assert len({r["outer_state"] for r in records}) == 2
    # A state this small travels inside the commit that writes it: the later ones name it there.
    assert [sha for sha, _ in records[OUTER_EVERY]["inline"]][-1] == records[-1]["outer_state"]
    assert not mailbox.list("blobs/")
    b = lambda r: 2.0 - 2.0 ** (1 - r)  # noqa: E731
    np.testing.assert_allclose(params["w"], [-sum(1 + 0.5 * b(r) for r in range(1, last + 1))], rtol=1e-6)

    second = Merger(mailbox, run, algorithm, "m2", emit=lambda event: None, clock=lambda: 0.0)
    second.looks.look_seconds = 0.0
    contribute(mailbox, run, last + 1, 1.0)
    [committed] = second.step({0: (last, params)}, live, [last])
    # It read b_(OUTER_EVERY + 1), the state round `last` names, not b_last, which only the first merger held.
    carried = 0.5 * b(OUTER_EVERY + 1) + 1.0
    np.testing.assert_allclose(committed.params["w"], params["w"] - (1 + 0.5 * carried), rtol=1e-6)
    assert abs(carried - (0.5 * b(last) + 1.0)) > 1e-4  # the two are told apart
    assert "outer_round" not in read_commit(mailbox, 0, last + 1)  # its first commit writes its own state
