"""A merger retrying a round after a failed write commits what one attempt would have: the outer step
is applied once, whatever the failed attempt did before it failed. Computed by hand, one parameter."""

import numpy as np
import pytest

from slowlink.algorithms.diloco import DiLoCo
from slowlink.errors import MailboxUnavailable
from slowlink.mailbox.memory import MemoryMailbox
from slowlink.protocol import contribution, keys
from slowlink.protocol.merger import Merger
from slowlink.protocol.run import get_blob, open_run, read_commit
from slowlink.wire import payload


class FailsNextCommit(MemoryMailbox):
    """Fails the next PUT of a commit record, before the store sees it, once `armed` (a one-parameter
    model's commit carries its parameters inline: the record is the commit's one write)."""

    armed = False

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        if self.armed and key.startswith("commits/"):
            self.armed = False
            raise MailboxUnavailable(f"injected: PUT {key} failed before reaching the store")
        return super().put(key, data, if_absent=if_absent, if_match=if_match)


def contribute(mailbox, run, round_: int, delta: float) -> None:
    """Node n's contribution to fragment 0: Δ = θ_anchor − θ_local = `delta`."""
    values = {"w": np.array([delta], np.float32)}
    claims = {
        "base": round_ - 1,
        "samples": 1,
        "steps": 1,
        "final": False,
        "step_seconds": 0.1,
        "norm": abs(delta),
    }
    mailbox.put(
        keys.contribution(0, round_, "n"),
        payload.pack(values, contribution.header(run, 0, round_, "n", claims)),
    )


def test_a_round_retried_after_a_failed_write_applies_the_outer_momentum_once():
    # η = 0.7, μ = 0.9, θ₀ = 0, Δ = 1 in both rounds (outer Nesterov: b ← μ·b + Δ; θ ← θ − η·(Δ + μ·b)).
    # Round 1: b = 1,   θ₁ = 0 − 0.7·(1 + 0.9·1)       = −1.33.
    # Round 2: b = 1.9, θ₂ = −1.33 − 0.7·(1 + 0.9·1.9) = −3.227.
    # A retry that starts from the failed attempt's b = 1.9 gives b = 2.71 and θ₂ = −3.7373 instead.
    algorithm = DiLoCo(sync_every=10, outer_lr=0.7, outer_momentum=0.9)
    mailbox = FailsNextCommit()
    run, _ = open_run(mailbox, config=algorithm.to_dict(), schema=[("w", (1,), "float32")],
                      schema_digest="0" * 64, plan=[["w"]], initial=lambda: [{"w": np.zeros(1, np.float32)}])  # fmt: skip
    merger = Merger(mailbox, run, algorithm, "m", emit=lambda event: None, clock=lambda: 0.0)
    merger.looks.look_seconds = 0.0  # rounds/ listed at every step, as the Courier does a sync period apart
    live = lambda fresh: {"n"}  # noqa: E731

    contribute(mailbox, run, 1, 1.0)
    [first] = merger.step({0: (0, {"w": np.zeros(1, np.float32)})}, live, [0])
    contribute(mailbox, run, 2, 1.0)
    mailbox.armed = True
    with pytest.raises(MailboxUnavailable):
        merger.step({0: (1, first.params)}, live, [1])  # fails writing round 2's commit
    [second] = merger.step({0: (1, first.params)}, live, [1])  # as the Courier's next turn does

    np.testing.assert_allclose(first.params["w"], [-1.33], rtol=1e-6)
    np.testing.assert_allclose(second.params["w"], [-3.227], rtol=1e-6)
    assert merger.outer_states[0][0] == 2  # the state the next round starts from: b once more, not twice
    np.testing.assert_allclose(merger.outer_states[0][1]["w"], [1.9], rtol=1e-6)
    # Round 1's b is the one in the store (inside the first commit; round 2 names it there, OUTER_EVERY)
    named = read_commit(mailbox, 0, 2)["outer_state"]
    momentum, _ = payload.unpack(get_blob(mailbox, named, 1 << 20, read_commit(mailbox, 0, 1)))
    np.testing.assert_allclose(momentum["w"], [1.0], rtol=1e-6)
    assert read_commit(mailbox, 0, 2)["outer_round"] == 1
