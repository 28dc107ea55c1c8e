"""Each counter of session.stats is named after the event that feeds it (docs/events.md): a reader who sees
`commits_applied: 3` finds three `commit_applied` events in the log, not a differently named count."""

import slowlink as sl

from .nodes import batches, sgd_step, tiny_mlp

# stat field -> (the event that feeds it, whether the stat sums the event's "steps" rather than counting it)
FED_BY = {
    "commits_applied": ("commit_applied", False),
    "rounds_merged": ("round_merged", False),
    "contributions_sent": ("contribution_sent", False),
    "contributions_late": ("contribution_late", False),
    "contributions_rejected": ("contribution_rejected", False),
    "own_contributions_rejected": ("own_contribution_rejected", False),
    "contributions_refused": ("contribution_refused", False),
    "syncs_deferred": ("sync_deferred", False),
    "syncs_skipped": ("sync_skipped", False),
    "steps_replaced": ("steps_replaced", True),
    "steps_dropped": ("steps_dropped", True),
    "steps_unconfirmed": ("steps_unconfirmed", True),
    "mailbox_errors": ("mailbox_error", False),
    "uploads_failed": ("upload_failed", False),
    "stalls": ("stalled", False),
}


def test_every_counter_is_named_after_the_event_that_feeds_it_and_equals_its_count():
    events = []
    model = tiny_mlp()
    # One node leading its own run: it merges (round_merged), applies (commit_applied) and, leaving three
    # steps after its last sync without flush_on_close, drops them (steps_dropped).
    algorithm = sl.DiLoCo(sync_every=2, overlap_steps=0, mixing=0.5)
    with sl.Session(model, algorithm=algorithm, mailbox=sl.MemoryMailbox(), node_id="n", poll_seconds=0.005,
                    on_event=events.append) as session:  # fmt: skip
        for batch in batches(0, 7):
            sgd_step(model, batch, 0.1)
            session.step(samples=4)
    stats = session.stats
    counters = {
        name for name, value in vars(stats).items() if isinstance(value, int) and not isinstance(value, bool)
    }
    counters -= {"step", "samples", "bytes_sent", "bytes_received", "requests"}
    assert counters == set(FED_BY), "a new counter needs its event here"
    for stat, (kind, sums_steps) in FED_BY.items():
        fed = [e for e in events if e.kind == kind]
        expected = sum(e.data["steps"] for e in fed) if sums_steps else len(fed)
        assert getattr(stats, stat) == expected, f"stats.{stat} is not the {kind} events' count"
    assert stats.commits_applied == stats.rounds_merged == 3 and stats.steps_dropped == 1
