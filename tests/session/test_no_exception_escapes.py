"""What once killed a node, then each leader that took over: a deeply nested record or head.json, payload
headers of the wrong types, a contribution with an extra leading dimension, samples of 10**400, an object
whose key slowlink could not have written. Planted into a live run over a directory and over moto's S3
server, each is a rejection with a reason (or is skipped and reported), and the run goes on."""

import itertools
import json
import time

import numpy as np

import slowlink as sl
from slowlink.protocol import keys, records
from slowlink.protocol.run import read_commit, read_run

from .nodes import batches, sgd_step, tiny_mlp
from .test_nothing_lost import raw_payload, shapes

DEEP = "[" * 100_000 + "]" * 100_000  # 200 kB of nesting: RecursionError in json.loads


CLAIMS = {"base": 0, "samples": 4, "steps": 2, "final": False, "step_seconds": 0.01, "norm": 0.0}


def contribution(run, node: str, round_: int, arrays: dict, claims: bytes | None = None) -> bytes:
    """A contribution's object, with `claims` (JSON text) in its header as they are, good or bad."""
    text = (claims or records.encode(CLAIMS | {"base": round_ - 1})).decode()
    return raw_payload(
        arrays, run.expect(kind="delta", fragment=0, round=round_, node=node) | {"claims": text}
    )


def plant_everything(store, run, round_: int) -> set[str]:
    """Every trigger, aimed at `round_`; returns the node ids of the bad contributions."""
    zeros = {name: np.zeros(shape, np.float32) for name, shape in shapes(run).items()}
    good = records.encode(CLAIMS | {"base": round_ - 1})
    bad = {
        "nested": contribution(run, "nested", round_, zeros, good[:-1] + b',"deep":' + DEEP.encode() + b"}"),
        "huge-samples": contribution(
            run, "huge-samples", round_, zeros, good.replace(b'"samples":4', b'"samples":1' + b"0" * 400)
        ),
        # an extra leading dimension
        "leading": contribution(
            run, "leading", round_, {name: values[None] for name, values in zeros.items()}
        ),
    }
    for node, shapes_value in (("shapes-list", "[1, 2]"), ("shapes-int", "7")):
        data = contribution(run, node, round_, zeros)
        length = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + length])
        header["__metadata__"]["shapes"] = shapes_value
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        bad[node] = len(text).to_bytes(8, "little") + text + data[8 + length :]
    for node, data in bad.items():
        store.put(keys.contribution(0, round_, node), data)
    return set(bad)


def train_until(session, model, version: int, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    for batch in itertools.cycle(batches(0, 20)):
        sgd_step(model, batch, 0.1)
        session.step(samples=4)
        time.sleep(0.005)
        if session.stats.versions[0] >= version or time.monotonic() > deadline:
            return


def test_no_planted_record_or_payload_kills_the_node_or_stalls_the_run(store):
    model, events = tiny_mlp(), []
    algorithm = sl.DiLoCo(sync_every=2, grace_seconds=1.0)
    with sl.Session(model, algorithm=algorithm, mailbox=store, node_id="good", poll_seconds=0.005,
                    lease_seconds=3.0, on_event=events.append) as session:  # fmt: skip
        run = read_run(store)
        planted = plant_everything(store, run, round_=1)
        store.put(keys.HEAD + ".deep.json", DEEP.encode())  # a record nobody reads: harmless
        odd = "rounds/0000/0000000001/a b" if isinstance(store, sl.S3Mailbox) else None
        if odd:  # a key slowlink could not have written, in the folder the leader lists and cleans
            store._client().put_object(Bucket=store.bucket, Key=f"{store.prefix}/{odd}", Body=b"x")
        train_until(session, model, 6)
        assert session.courier.failure is None
        store.put(keys.HEAD, ('{"versions":' + DEEP + "}").encode())  # then head.json itself
        train_until(session, model, 9)
        assert session.courier.failure is None
    assert session.stats.versions[0] >= 9
    record = read_commit(store, 0, 1)
    assert {r["node"] for r in record["rejected"]} == planted
    assert all(r["reason"] for r in record["rejected"])
    assert [c["node"] for c in record["contributors"]] == ["good"]
    if odd:
        assert any(e.kind == "key_ignored" and "a b" in e.data["key"] for e in events)
