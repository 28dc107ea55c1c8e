"""JSON from untrusted bytes: bounded in size and nesting, finite, integers within 64 bits, no key twice.

`loads` is the one JSON parser for everything read from the store (records, payload headers, the shapes
inside them): any failure is a PayloadError naming `what` and the rule. What the values mean is left to
the callers' checks (`protocol/records.py`, `wire/payload.py`).
"""

import json
import math
import re
import reprlib
from collections import Counter
from typing import NoReturn

import numpy as np

from ..errors import PayloadError

# Our deepest JSON is 4 levels (run.json's schema); 32 leaves room and keeps the parser far from
# Python's recursion limit, which json.loads would otherwise hit (RecursionError) on a deep forgery.
MAX_DEPTH = 32
# Nothing slowlink writes needs a larger integer; refusing them here means no caller ever meets one
# that float() or numpy cannot convert (OverflowError), even in fields no spec types (run.json's config).
INT_LIMIT = 2**63

# A JSON string, or the unterminated rest of the text; possessive, so the scan is linear on any input.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*+"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_SCAN_CHUNK = 1 << 20

# How error messages show an untrusted value: a few items and characters, so a message stays a line.
_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxlist, _BRIEF.maxdict, _BRIEF.maxstring, _BRIEF.maxother = 2, 6, 4, 80, 40


class _Refused(ValueError):
    """A value the parser's hooks refuse; `loads` turns it into a PayloadError naming the input."""


def loads(data: bytes | str, *, what: str, max_bytes: int) -> object:
    """The JSON value of `data` (UTF-8), or PayloadError naming `what`: larger than `max_bytes`, not
    JSON, nested deeper than MAX_DEPTH, NaN or infinite numbers, integers beyond ±2**63, a key twice."""
    if len(data) > max_bytes:
        raise PayloadError(f"{what} is {len(data)} bytes, over the {max_bytes}-byte limit")
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    except UnicodeDecodeError as error:
        raise PayloadError(f"{what} is not valid JSON: {error}") from None
    depth = nesting_depth(text)
    if depth > MAX_DEPTH:
        raise PayloadError(f"{what} nests deeper than {MAX_DEPTH} levels, the limit for JSON from the store")
    try:
        return json.loads(
            text,
            parse_int=_integer,
            parse_float=_finite,
            parse_constant=_no_constant,
            object_pairs_hook=_unique_keys,
        )
    except _Refused as error:
        raise PayloadError(f"{what} holds {error}") from None
    except RecursionError:  # not reached after the scan above; kept so a deep input can never escape
        raise PayloadError(f"{what} nests too deep to parse") from None
    except ValueError as error:  # JSONDecodeError, and int's own digit limit
        raise PayloadError(f"{what} is not valid JSON: {error}") from None


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON `text` (brackets inside strings do not count).

    Exact for valid JSON; on invalid JSON it is at least the depth json.loads reaches before failing,
    since both read strings alike up to the first error. C-speed regexes and numpy, no recursion."""
    brackets = np.frombuffer(_NOT_BRACKET.sub("", _STRING.sub("", text)).encode("ascii"), np.uint8)
    deepest, depth = 0, 0
    for start in range(0, brackets.size, _SCAN_CHUNK):
        # "[" (0x5B) and "{" (0x7B) have bit 1 set, "]" (0x5D) and "}" (0x7D) do not: +1 and -1.
        steps = ((brackets[start : start + _SCAN_CHUNK] >> 1) & 1).astype(np.int32) * 2 - 1
        levels = np.cumsum(steps, dtype=np.int64) + depth
        deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
        if deepest > MAX_DEPTH:
            break
    return deepest


def _integer(literal: str) -> int:
    # Checked before int(): a 400-digit literal needs no conversion to be refused.
    value = int(literal) if len(literal) <= 20 else None
    if value is None or not -INT_LIMIT <= value < INT_LIMIT:
        raise _Refused(f"the integer {literal[:24]}{'…' if len(literal) > 24 else ''}, beyond ±2**63")
    return value


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e400 parses as infinity
        raise _Refused(f"the number {literal[:24]}, which is not a finite float64")
    return value


def _no_constant(name: str) -> NoReturn:
    raise _Refused(f"{name}, which is not a finite number")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    # json.loads would keep the last of two equal keys: a reader and a signer could then see different records.
    record = dict(pairs)
    if len(record) != len(pairs):
        twice = next(key for key, count in Counter(key for key, _ in pairs).items() if count > 1)
        raise _Refused(f"the key {twice[:64]!r} twice")
    return record


def brief(value: object) -> str:
    """A short repr of an untrusted value, for error messages."""
    return _BRIEF.repr(value)
