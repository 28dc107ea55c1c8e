"""Where everything of a run lives in its mailbox. Numbers are fixed-width so byte order is numeric order.

run.json                                  create-once: configuration, schema, plan, initial blobs
creating.json                             create-once: the node uploading the initial model, beaten meanwhile
head.json                                 a hint: newest commits every few, moved forward by compare-and-swap
leader.json                               the merging node, renewed by compare-and-swap
nodes/<node>.json                         a node's lease: overwritten every beat
blobs/<sha256>                            immutable payloads, written before any record names them
rounds/<fragment>/<round>/<node>.delta    a contribution: its payload, claims in the header (contribution.py);
                                          a round's folder is dropped whole once it is merged; the merger's
                                          own only when it hands them over (own.py)
commits/<fragment>/<round>.json           create-once: the commit point and the run's history
"""

import re

RUN = "run.json"
CREATING = "creating.json"
HEAD = "head.json"
LEADER = "leader.json"
NODES = "nodes/"
ROUNDS = "rounds/"

NODE_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


def blob(sha256: str) -> str:
    return f"blobs/{sha256}"


def node(node_id: str) -> str:
    return f"{NODES}{node_id}.json"


_LEASE = re.compile(r"^nodes/([a-z0-9][a-z0-9_-]{0,63})\.json$")


def parse_node(key: str) -> str | None:
    """The node id of a lease's key; None for anything slowlink does not write under nodes/."""
    match = _LEASE.match(key)
    return match.group(1) if match else None


def round_folder(fragment: int, round_: int) -> str:
    return f"{ROUNDS}{fragment:04d}/{round_:010d}/"


_CONTRIBUTION = re.compile(r"^rounds/(\d{4})/(\d{10})/([a-z0-9][a-z0-9_-]{0,63})\.delta$")


def parse_contribution(key: str) -> tuple[int, int, str] | None:
    """(fragment, round, node) of a contribution's key; None for anything else."""
    match = _CONTRIBUTION.match(key)
    return (int(match.group(1)), int(match.group(2)), match.group(3)) if match else None


_ROUND_KEY = re.compile(r"^rounds/(\d{4})/(\d{10})/")


def round_of(key: str) -> tuple[int, int] | None:
    """(fragment, round) of any key in a round's folder, contributions and anything else written there."""
    match = _ROUND_KEY.match(key)
    return (int(match.group(1)), int(match.group(2))) if match else None


def contribution(fragment: int, round_: int, node_id: str) -> str:
    return f"{round_folder(fragment, round_)}{node_id}.delta"


def commit(fragment: int, round_: int) -> str:
    return f"commits/{fragment:04d}/{round_:010d}.json"
