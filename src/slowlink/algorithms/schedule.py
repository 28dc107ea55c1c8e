"""The staggered schedule of Streaming DiLoCo (research/algorithms.md §2.2).

With H = sync_every and Q fragments, fragment q has offset t_q = q·s where s = max(1, ⌊H/Q⌋), and
syncs at local steps t = t_q + k·H for k ≥ 1: every fragment once per H steps, each after it has
trained H steps, and never two fragments at once when Q ≤ H.
"""


def fragment_offsets(sync_every: int, fragments: int) -> list[int]:
    spacing = max(1, sync_every // fragments)
    return [q * spacing for q in range(fragments)]


def due_fragments(step: int, sync_every: int, offsets: list[int]) -> list[int]:
    """The fragments whose sync falls on local step `step` (steps count from 1)."""
    return [
        q
        for q, offset in enumerate(offsets)
        if step >= offset + sync_every and (step - offset) % sync_every == 0
    ]
