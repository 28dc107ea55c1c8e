"""A 2-rank gloo island, rank 0 alone talking to the mailbox, and a plain node train one run on a DirMailbox:
rounds commit with both, and the island's ranks hold identical parameters after every step (DDP), or each its
rows of every commit (FSDP2); the same three processes run both (islands_node.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.optim.test_demo_gloo import free_port

ROOT = Path(__file__).parents[2]
ROLES = [("island", 0), ("island", 1), ("single", 0)]


def test_an_island_of_two_gloo_ranks_is_one_node_with_ddp_and_with_fsdp2(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    script, port = str(ROOT / "tests/collective/islands_node.py"), str(free_port())
    procs = [
        subprocess.Popen([sys.executable, script, role, str(rank), port, str(tmp_path)], env=env, cwd=ROOT)
        for role, rank in ROLES
    ]
    assert [proc.wait(timeout=300) for proc in procs] == [0, 0, 0]

    def results(kind: str) -> list[dict]:
        return [json.loads((tmp_path / f"{kind}-{role}{rank}.json").read_text()) for role, rank in ROLES]

    check_ddp(tmp_path / "ddp" / "run", *results("ddp"))
    check_fsdp(tmp_path / "fsdp" / "run", *results("fsdp"))


def check_ddp(mailbox: Path, lead: dict, other: dict, single: dict) -> None:
    """DDP: the island's contribution is its ranks' mean, and its ranks never drift apart."""
    # Rounds committed with both nodes (a round or two may close before the other joins): 12 steps, H = 3,
    # 2 fragments, 4 rounds of each.
    records = [json.loads(path.read_text()) for path in sorted((mailbox / "commits").glob("*/*.json"))]
    both = [r for r in records if {c["node"] for c in r["contributors"]} == {"island", "single"}]
    assert len(both) >= 4, [[c["node"] for c in r["contributors"]] for r in records]
    # The island's contribution is its ranks' mean, trained on both ranks' samples (4 a step each).
    for record in both:
        theirs, its = sorted(
            record["contributors"], key=lambda c: c["node"]
        )  # the island's, the plain node's
        assert theirs["samples"] / theirs["steps"] == 2 * its["samples"] / its["steps"] == 8
        assert 0.2 < theirs["norm"] / its["norm"] < 5  # a sum of the ranks' snapshots would be ≫ 5
    assert lead["applied"] == other["applied"] >= 4
    # The island's ranks: the same commits at the same steps, and the same parameters after every step.
    assert lead["trace"] == other["trace"]
    assert len({tuple(versions) for _, versions, _ in lead["trace"]}) >= 4  # commits came in while training
    # Only rank 0 talked to the mailbox.
    assert lead["bytes_sent"] > 0 and other["bytes_sent"] == 0
    # A join rank 0 cannot make: it raises why, and rank 1, waiting for its word, stops too (no hang).
    assert (lead["failed_join"], other["failed_join"]) == ("RunConfigMismatch", "IslandLeadFailed")
    # An FSDP1 model's flat parameters are refused on both ranks, naming the fix.
    assert all("FSDP1" in rank["refused"] and "fully_shard" in rank["refused"] for rank in (lead, other))
    # Leaving aligned the island's ranks with the same newest commits, and every node that left at the same
    # commits holds the same model (the plain node may hold one more: it can commit after the island left).
    assert lead["final"] == other["final"] and lead["left_at"] == other["left_at"]
    if single["left_at"] == lead["left_at"]:
        assert single["final"] == lead["final"]
    else:
        assert [a >= b for a, b in zip(single["left_at"], lead["left_at"], strict=True)] == [True, True]


def check_fsdp(mailbox: Path, lead: dict, other: dict, single: dict) -> None:
    """FSDP2 on gloo: each rank holds its rows of every tensor (7 and 3 rows: shards of 4 + 3 and 2 + 1), and
    the rows of every commit it applied are the rows of the commit the plain node holds, version for version."""
    records = [json.loads(path.read_text()) for path in sorted((mailbox / "commits").glob("*/*.json"))]
    both = [r for r in records if {c["node"] for c in r["contributors"]} == {"island", "single"}]
    assert len(both) >= 4, [[c["node"] for c in r["contributors"]] for r in records]
    for record in both:  # the island's contribution: both ranks' samples, a Δ of the plain node's size
        theirs, its = sorted(record["contributors"], key=lambda c: c["node"])
        assert theirs["samples"] / theirs["steps"] == 2 * its["samples"] / its["steps"] == 8
        assert 0.2 < theirs["norm"] / its["norm"] < 5
    assert lead["applied"] == other["applied"] >= 4
    rows = {"0.weight": (4, 3), "0.bias": (4, 3), "2.weight": (2, 1), "2.bias": (2, 1)}
    shared = sorted(set(lead["anchors"]) & set(other["anchors"]) & set(single["anchors"]))
    assert len([key for key in shared if not key.endswith(":0")]) >= 4, shared
    for key in shared:
        for name, whole in single["anchors"][key].items():
            mine, theirs = lead["anchors"][key][name], other["anchors"][key][name]
            assert (len(mine), len(theirs)) == rows[name]  # each rank holds its rows only
            assert mine + theirs == whole, (key, name)  # and they are the commit's, exactly
    assert lead["bytes_sent"] > 0 and other["bytes_sent"] == 0
    assert (lead["failed_join"], other["failed_join"]) == ("RunConfigMismatch", "IslandLeadFailed")
    # Rank 0 streams each contribution: its host allocations from publishing one to its upload stay within
    # the encoding and the payload it is framed into, plus a tensor in flight, below what the fragment whole
    # would take with its payload (main's whole gather: 1.2 MB here, where the bound is 0.7 MB).
    memory = lead["memory"]
    quiet = [(peak, payload) for peak, payload, delivered in memory["windows"] if not delivered]
    assert len(memory["windows"]) == 2 and quiet, memory
    for peak, payload in quiet:
        assert payload < memory["fragment"] * 0.51  # BF16: half of float32, and a header
        assert 0 < peak <= 2 * payload + 3 * memory["tensor"] < memory["fragment"] + payload, (peak, memory)
    # A DTensor placed otherwise than by rows over the island (here replicated) is refused on every rank.
    assert all("'weight' is a DTensor placed (Replicate(),)" in rank["refused"] for rank in (lead, other))
    # Leaving aligned the ranks' shards with the newest commits: together, the plain node's model where it
    # left at the same commits.
    assert lead["left_at"] == other["left_at"]
    if single["left_at"] == lead["left_at"]:
        assert {name: lead["final"][name] + other["final"][name] for name in rows} == single["final"]
