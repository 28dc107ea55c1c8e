"""The decoding boundary (issue 8): whatever bytes the store holds, reading a record or a payload raises
PayloadError and nothing else, since any other exception kills the communication thread and then each
leader that takes over. Each trigger found on main is a test here; a fuzz test then draws JSON-ish
values for every record kind from its FIELDS spec."""

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slowlink.errors import PayloadError
from slowlink.mailbox.memory import MemoryMailbox
from slowlink.protocol import keys, records
from slowlink.protocol.run import advance_head, read_commit, read_head, read_run
from slowlink.wire import payload
from slowlink.wire.compress import MAGIC

SHA = "ab" * 32
CLAIMS = {"base": 2, "samples": 64, "steps": 4, "final": False, "step_seconds": 0.25, "norm": 1.5}
COMMIT = {"fragment": 0, "round": 3, "params": SHA, "outer_state": None, "change": SHA, "merger": "n-1",
          "contributors": [{"node": "n-1", "blob": SHA, "samples": 64, "steps": 4, "final": False, "weight": 64.0}],
          "rejected": [{"node": "n-2", "reason": "its payload is missing from the mailbox"}], "flush_only": False}  # fmt: skip
RUN = {"format": "slowlink-run-3", "run_id": "0" * 32, "config": {"method": "DiLoCo", "outer_lr": 0.7},
       "schema": [["w", [3, 4], "float32"], ["b", [], "float32"]], "schema_digest": "d" * 64,
       "plan": [["w"], ["b"]], "initial": [SHA, SHA], "key_id": None}  # fmt: skip
LEADER = {"node": "n-1", "term": 2, "beat": 7}
LEASE = {"node": "n-1", "beat": 1, "step": 10, "samples": 640, "step_seconds": 0.25, "versions": [3, 1],
         "leader": True}  # fmt: skip
KINDS = {
    "run": (records.RUN_FIELDS, RUN),
    "head": (records.HEAD_FIELDS, {"versions": [3, 1]}),
    "leader": (records.LEADER_FIELDS, LEADER),
    "lease": (records.LEASE_FIELDS, LEASE),
    "claims": (records.CLAIM_FIELDS, CLAIMS),
    "commit": (records.COMMIT_FIELDS, COMMIT),
}
DEEP = 200_000  # 400 kB of brackets: json.loads alone raises RecursionError long before the end


def deep(levels: int = DEEP) -> str:
    return "[" * levels + "]" * levels


def with_field(record: dict, field: str, raw_json: str) -> bytes:
    """`record` encoded with `field`'s value replaced by the JSON text `raw_json`, as a forger writes it."""
    body = {key: value for key, value in record.items() if key != field}
    return (json.dumps(body)[:-1] + f', "{field}": {raw_json}}}').encode()


def decode(kind: str, data: bytes) -> dict:
    fields, _ = KINDS[kind]
    return records.decode(data, fields, what=f"{kind}.json")


# ---- records: the triggers found on main -----------------------------------------------------------


def test_the_example_records_decode_as_they_were_written():
    for kind, (_, record) in KINDS.items():
        assert decode(kind, records.encode(record)) == record


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_deeply_nested_record_raises_payload_error_not_recursion_error(kind):
    _, record = KINDS[kind]
    with pytest.raises(PayloadError, match="nests deeper than 32 levels"):
        decode(kind, deep().encode())
    with pytest.raises(PayloadError, match="nests deeper than 32 levels"):
        decode(kind, with_field(record, next(iter(record)), deep()))


def test_a_deeply_nested_head_is_refused_and_rebuilt_from_the_commits():
    mailbox = MemoryMailbox()
    mailbox.put(keys.commit(0, 1), records.encode(COMMIT | {"round": 1}))
    mailbox.put(keys.HEAD, ('{"versions": ' + deep() + "}").encode())
    with pytest.raises(PayloadError, match=f"{keys.HEAD} nests deeper than 32 levels"):
        read_head(mailbox, 1)
    advance_head(mailbox, [0], 0, 1)  # what a merger does after a commit: it rebuilds head.json
    assert read_head(mailbox, 1)[0] == [1]


@pytest.mark.parametrize(
    ("field", "raw", "rule"),
    [
        ("samples", str(10**400), "beyond ±2\\*\\*63"),  # OverflowError in float(samples) on main
        ("samples", str(2**63 - 1), "expected an integer from 0 to 9007199254740991"),
        ("samples", "-1", "expected an integer from 0 to"),
        ("base", str(2**53), "expected an integer from 0 to"),
        ("step_seconds", "NaN", "NaN, which is not a finite number"),
        ("norm", "Infinity", "Infinity, which is not a finite number"),
        ("norm", "1e400", "not a finite float64"),
        ("step_seconds", "-0.5", "expected a finite number ≥ 0"),
        ("final", '"yes"', "expected"),
    ],
)
def test_contribution_numbers_are_bounded_and_finite_and_names_are_checked(field, raw, rule):
    with pytest.raises(PayloadError, match=rule):
        decode("claims", with_field(CLAIMS, field, raw))


@pytest.mark.parametrize(
    ("field", "raw", "rule"),
    [
        ("contributors", "[5]", r"field 'contributors'\[0\] is 5, expected a JSON object"),
        ("contributors", '[{"node": "n-1"}]', r"field 'contributors'\[0\] lacks the field 'blob'"),
        ("contributors", json.dumps([COMMIT["contributors"][0] | {"samples": 10**30}]), "beyond ±2"),
        ("contributors", json.dumps([COMMIT["contributors"][0] | {"blob": 7}]), r"\['blob'\] is 7"),
        ("contributors", '{"n-1": 1}', "expected a list"),
        ("rejected", '["n-2"]', r"field 'rejected'\[0\] is 'n-2', expected a JSON object"),
        ("rejected", '[{"node": "n-2", "reason": ["x"]}]', "has type list, expected str"),
        ("outer_state", "[]", "expected a string matching"),
        ("flush_only", "1", "has type int, expected bool"),
    ],
)
def test_a_commits_nested_fields_are_typed(field, raw, rule):
    with pytest.raises(PayloadError, match=rule):
        decode("commit", with_field(COMMIT, field, raw))


@pytest.mark.parametrize(
    ("raw", "rule"),
    [("[true, 1]", r"\[0\] is True"), ("[1.0]", r"\[0\] is 1.0"), ("[-1]", "from 0 to"), ('"3"', "a list")],
)
def test_head_versions_are_a_list_of_round_numbers(raw, rule):
    with pytest.raises(PayloadError, match=rule):
        decode("head", with_field({"x": 0}, "versions", raw))


@pytest.mark.parametrize(
    ("field", "raw", "rule"),
    [
        ("schema", '[["w", [3, 4]]]', "expected a list of 3 values"),  # ValueError unpacking it on main
        ("schema", '[["w", 5, "float32"]]', "has the shape 5"),  # TypeError in tuple(5) on main
        ("schema", '[["w", [2, -1], "float32"]]', "has the shape"),
        ("schema", f'[["w", [{2**40}, {2**40}], "float32"]]', "at most 2\\*\\*53 - 1 values"),
        ("plan", '[["w"], "b"]', r"field 'plan'\[1\] is 'b', expected a list"),
        ("initial", '["short"]', "expected a string matching"),
        ("config", "[]", "has type list, expected dict"),
        ("key_id", "5", "expected a string"),
    ],
)
def test_run_json_schema_and_plan_are_typed_through_read_run(field, raw, rule):
    mailbox = MemoryMailbox()
    mailbox.put(keys.RUN, with_field(RUN, field, raw))
    with pytest.raises(PayloadError, match=rule):
        read_run(mailbox)


def test_check_run_refuses_a_plan_that_names_tensors_outside_the_schema():
    records.check_run(RUN, "run.json")
    with pytest.raises(PayloadError, match="plans tensors"):
        records.check_run(RUN | {"plan": [["w"], ["nope"]]}, "run.json")
    with pytest.raises(PayloadError, match="names 1 initial blobs for 2 fragments"):
        records.check_run(RUN | {"initial": [SHA]}, "run.json")


def test_a_record_naming_a_field_twice_is_refused():
    # json.loads keeps the last: a signature checked over the bytes and a reader could disagree.
    with pytest.raises(PayloadError, match="the key 'term' twice"):
        decode("leader", b'{"node": "a", "term": 1, "beat": 1, "term": 99}')


def test_read_commit_checks_the_commit_before_comparing_its_round():
    mailbox = MemoryMailbox()
    mailbox.put(keys.commit(0, 3), with_field(COMMIT, "round", '"3"'))
    with pytest.raises(PayloadError, match="field 'round' is '3'"):
        read_commit(mailbox, 0, 3)


def test_a_released_leader_record_is_readable():
    assert decode("leader", records.encode({"node": "", "term": 4, "beat": -1}))["node"] == ""
    with pytest.raises(PayloadError, match="field 'beat' is -2"):
        decode("leader", records.encode({"node": "", "term": 4, "beat": -2}))


# ---- payloads: the triggers found on main (the fuzz is tests/wire/test_payload_fuzz.py) --------------


def frame(table: dict, data: bytes = b"", *, header_text: str | None = None) -> bytes:
    """A safetensors file with `table` as its header (or the raw `header_text`), then `data`."""
    header = (json.dumps(table) if header_text is None else header_text).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + data


def one_tensor(**metadata: object) -> bytes:
    """A payload of one F32 tensor "w" of 4 values, with `metadata` overriding its header fields."""
    meta = {"format": payload.FORMAT, "encoding": "F32", "shapes": json.dumps({"w": [4]})} | metadata
    return frame({"__metadata__": meta, "w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                 np.ones(4, np.float32).tobytes())  # fmt: skip


def test_the_forged_payload_helper_makes_a_readable_payload():
    arrays, header = payload.unpack(one_tensor())
    assert arrays["w"].tolist() == [1.0] * 4 and header["encoding"] == "F32"


@pytest.mark.parametrize(
    ("shapes", "rule"),
    [
        ("[[4]]", "'shapes' is \\[\\[4\\]\\], not a JSON object"),  # AttributeError on main
        ("4", "'shapes' is 4, not a JSON object"),  # AttributeError on main
        ('"w"', "'shapes' is 'w', not a JSON object"),  # AttributeError on main
        ('{"w": 4}', "tensor 'w' has the shape 4"),  # TypeError on main
        ('{"w": "ab"}', "tensor 'w' has the shape 'ab'"),  # TypeError on main
        ('{"w": [true, 4]}', "tensor 'w' has the shape \\[True, 4\\]"),
        ('{"w": [4], "w": [4]}', "the key 'w' twice"),
        ("[" * 5000 + "]" * 5000, "nests deeper than 32"),  # RecursionError on main
    ],
)
def test_payload_shapes_that_are_not_an_object_of_shapes_raise_payload_error(shapes, rule):
    with pytest.raises(PayloadError, match=rule):
        payload.unpack(one_tensor(shapes=shapes))


@pytest.mark.parametrize("encoding", [["F32"], {"F32": 1}, 32, None])
def test_a_payload_encoding_that_is_not_a_string_raises_payload_error(encoding):
    # TypeError (unhashable) on main for a list or a dict
    with pytest.raises(PayloadError, match="header field 'encoding' is .*, not a string"):
        payload.unpack(one_tensor(encoding=encoding))


def test_payload_metadata_values_must_be_strings():
    with pytest.raises(PayloadError, match="header field 'run' is 5, not a string"):
        payload.read_header(one_tensor(run=5))


def test_a_deeply_nested_payload_header_raises_payload_error_plain_and_compressed():
    zstandard = pytest.importorskip("zstandard")
    meta = {"format": payload.FORMAT, "encoding": "F32", "shapes": "{}"}
    text = json.dumps({"__metadata__": meta})[:-1] + ', "x": ' + deep() + "}"
    plain = frame({}, header_text=text)
    packed = zstandard.ZstdCompressor(write_content_size=True, write_checksum=True).compress(plain)
    for data in (plain, MAGIC + packed):
        with pytest.raises(PayloadError, match="nests deeper than 32 levels"):
            payload.read_header(data)
        with pytest.raises(PayloadError, match="nests deeper than 32 levels"):
            payload.unpack(data)


@pytest.mark.parametrize("shape", [[10**30], [2**62, 2**62, 4], [2**40, 2**40]])
def test_an_entry_shape_whose_product_overflows_raises_payload_error(shape):
    # [10**30]: OverflowError in np.prod on main; the others wrap around int64 there.
    data = one_tensor()
    table = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    table["w"]["shape"] = shape
    with pytest.raises(PayloadError, match="payload entry 'w' has the shape|beyond ±2"):
        payload.unpack(frame(table, np.ones(4, np.float32).tobytes()))


def test_entries_whose_tensor_names_collide_are_refused():
    # Tensors "w" and "w@x": the entry "w@x" is the main entry of one, or an "@x" entry of the other.
    meta = {"format": payload.FORMAT, "encoding": "F32", "shapes": json.dumps({"w": [1], "w@x": [1]})}
    table = {"__metadata__": meta, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
             "w@x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}  # fmt: skip
    with pytest.raises(
        PayloadError, match="entry 'w@x' belongs to tensors \\['w@x', 'w'\\]: their names collide"
    ):
        payload.unpack(frame(table, np.ones(2, np.float32).tobytes()))
    with pytest.raises(PayloadError, match="tensor names collide"):
        payload.pack(
            {"w": np.ones(32, np.float32), "w@scale": np.ones(1, np.float32)}, {}, encoding="F8_E4M3"
        )


def test_a_contribution_with_an_extra_leading_dimension_is_refused_by_expect_shapes():
    data = payload.pack({"w": np.ones((1, 3, 4), np.float32), "b": np.ones(4, np.float32)}, {"run": "r"})
    # Unchecked, it decodes; a merge with honest (3, 4) contributions then raises ValueError.
    assert payload.unpack(data)[0]["w"].shape == (1, 3, 4)
    with pytest.raises(PayloadError, match=r"payload tensor 'w' has shape \(1, 3, 4\), expected \(3, 4\)"):
        payload.unpack(data, expect_shapes={"w": (3, 4), "b": (4,)})


# ---- the fuzz: every record kind, values drawn from its spec and then broken -------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([10**400, -(10**400), 2**53, 2**53 - 1, 2**63, -1, 0])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["", SHA, "n-1", "../x", "A"])
)
JSONISH = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


def valid(spec: object) -> st.SearchStrategy:
    """Values that match `spec`, drawn the way an honest node could write them."""
    if isinstance(spec, records.Int):
        return st.integers(spec.low, spec.high)
    if isinstance(spec, records.Real):
        low = None if math.isinf(spec.low) else spec.low
        return st.floats(min_value=low, allow_nan=False, allow_infinity=False) | st.integers(0, 2**53)
    if isinstance(spec, records.Text):
        return st.text(max_size=8) if spec.pattern is None else st.from_regex(spec.pattern, fullmatch=True)
    if isinstance(spec, records.Maybe):
        return st.none() | valid(spec.spec)
    if isinstance(spec, records.ListOf):
        return st.lists(valid(spec.item), max_size=3)
    if isinstance(spec, records.Row):
        return st.tuples(*map(valid, spec.items)).map(list)
    if isinstance(spec, records.Object):
        return valid_record(spec.fields)
    if isinstance(spec, records.Shape):
        return st.lists(st.integers(0, 16), max_size=4)
    kinds = spec if isinstance(spec, tuple) else (spec,)
    plain = {str: st.text(max_size=8), bool: st.booleans(), int: st.integers(-(2**53), 2**53),
             float: st.floats(allow_nan=False, allow_infinity=False), type(None): st.none(),
             dict: st.dictionaries(st.text(max_size=6), st.integers() | st.text(max_size=4), max_size=3),
             list: st.lists(st.integers(), max_size=3)}  # fmt: skip
    return st.one_of(*(plain[kind] for kind in kinds))


def valid_record(fields: dict) -> st.SearchStrategy:
    required = {k: valid(s) for k, s in fields.items() if not isinstance(s, records.Omittable)}
    optional = {k: valid(s.spec) for k, s in fields.items() if isinstance(s, records.Omittable)}
    return st.fixed_dictionaries(required, optional=optional)


@st.composite
def broken(draw, fields: dict) -> bytes:
    """An honest record of `fields`, then some of: fields replaced by JSON-ish values, dropped, nested
    deep, the whole record swapped for a value or nested; or raw bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=64))
    record = draw(valid_record(fields))
    for _ in range(draw(st.integers(0, 3))):
        field = draw(st.sampled_from(sorted(fields)))
        action = draw(st.sampled_from(["replace", "drop", "nest", "list-for-dict"]))
        if action == "replace":
            record[field] = draw(JSONISH)
        elif action == "drop":
            record.pop(field, None)
        elif action == "nest":
            record[field] = json.loads("[" * 40 + json.dumps(record.get(field)) + "]" * 40)
        else:
            record[field] = [record.get(field)]
    text = json.dumps(record if draw(st.booleans()) else draw(JSONISH | st.just(record)))
    levels = draw(st.sampled_from([0, 0, 0, 31, 33, 3000]))
    return ("[" * levels + text + "]" * levels).encode()


FUZZ = settings(derandomize=True, max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip


@pytest.mark.parametrize("kind", list(KINDS))
@FUZZ
@given(data=st.data())
def test_only_payload_error_escapes_decode_for_any_json_ish_record(kind, data):
    fields, _ = KINDS[kind]
    try:
        record = records.decode(data.draw(broken(fields)), fields, what=f"{kind}.json")
    except PayloadError:
        return
    for name, spec in fields.items():  # what decode returns matches its spec
        if name in record:
            records.check(record[name], spec.spec if isinstance(spec, records.Omittable) else spec, name)


@pytest.mark.parametrize("kind", list(KINDS))
@FUZZ
@given(data=st.data())
def test_every_record_drawn_from_its_spec_decodes_to_itself(kind, data):
    fields, _ = KINDS[kind]
    record = data.draw(valid_record(fields))
    assert records.decode(records.encode(record), fields, what=f"{kind}.json") == record


@FUZZ
@given(data=st.data())
def test_the_readers_of_run_head_and_commits_raise_only_payload_error(data):
    mailbox = MemoryMailbox()
    mailbox.put(keys.RUN, data.draw(broken(records.RUN_FIELDS)))
    mailbox.put(keys.HEAD, data.draw(broken(records.HEAD_FIELDS)))
    mailbox.put(keys.commit(0, 3), data.draw(broken(records.COMMIT_FIELDS)))
    for read in (
        lambda: read_run(mailbox),
        lambda: read_head(mailbox, 2),
        lambda: read_commit(mailbox, 0, 3),
    ):
        try:
            read()
        except PayloadError:
            pass
