"""Tensor encodings for the wire: how one float32 array becomes named arrays in a payload and back.

An encoding is a pair of pure functions. `encode(values)` takes a float32 array and returns named
arrays to store (suffix -> array; "" is the main entry, other suffixes start with "@", e.g. "@scale"); `decode(entries, shape)` rebuilds float32.
`ENCODINGS` maps each `delta_dtype` / `commit_dtype` name to its pair.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import PayloadError


@dataclass(frozen=True)
class Encoding:
    name: str
    encode: Callable[[np.ndarray], dict[str, np.ndarray]]
    decode: Callable[[dict[str, np.ndarray], tuple[int, ...]], np.ndarray]


def _encode_f32(values: np.ndarray) -> dict[str, np.ndarray]:
    return {"": np.ascontiguousarray(values, dtype=np.float32)}


def _decode_f32(entries: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    return entries[""].astype(np.float32, copy=False).reshape(shape)


ENCODINGS: dict[str, Encoding] = {
    "F32": Encoding("F32", _encode_f32, _decode_f32),
}


def get_encoding(name: str) -> Encoding:
    try:
        return ENCODINGS[name]
    except KeyError:
        raise PayloadError(f"unknown encoding {name!r}; known encodings are {sorted(ENCODINGS)}") from None
