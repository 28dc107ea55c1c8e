"""A fragment's arrays as a payload's encoded entries, encoded where they live: torch tensors on their own
device when the encoding has a torch form there (on_device.py: F32, BF16, F8_E4M3), then only the entries
come to host; anything else on the host, by encodings.py. With error feedback or without; either way the
bytes are the same (tests/wire/test_on_device.py).
"""

from ..errors import PayloadError
from ..frameworks.base import host_arrays
from .encodings import get_encoding
from .error_feedback import error_feedback_encode

# name -> (shape, suffix -> entry): what payload.pack_encoded frames
Encoded = dict[str, tuple[tuple[int, ...], dict]]


class HostBuffer:
    """Host memory the entries of fragments encoded on a device are copied into (on_device.copy_to_host):
    grown when a fragment needs more, reused from one to the next, so no contribution costs fresh host
    memory."""

    def __init__(self) -> None:
        self.memory = None  # a torch uint8 tensor in host memory, once a device encoding needed one


def encode_fragment(
    arrays: dict,
    encoding: str,
    *,
    feedback: bool = False,
    residual: dict | None = None,
    buffer: "HostBuffer | None" = None,
) -> tuple[Encoded, dict | None]:
    """(the entries of each array, as host arrays; the new residual when `feedback`, else None). `residual`,
    what the last contribution's encoding lost, is added first (error_feedback.py); `buffer`, a HostBuffer,
    is where entries encoded on a device come to host (a new one if None): they are valid until its next
    use. PayloadError names the tensor an encoding refuses."""
    on_device = _device_codecs(arrays, encoding)
    if on_device is None:
        codec, arrays = get_encoding(encoding), host_arrays(arrays)
        residual = host_arrays(residual) if residual is not None else None
    else:
        codec = on_device.ENCODINGS[encoding]
        if residual is not None:  # one restored from a checkpoint, or left by a host encoding, is on host
            residual = on_device.beside(arrays, residual)
    encoded, new_residual = {}, {} if feedback else None
    for name, values in arrays.items():
        try:
            if feedback:
                entries, new_residual[name] = error_feedback_encode(
                    values, None if residual is None else residual[name], codec
                )
            else:
                entries = codec.encode(values)
        except PayloadError as error:
            raise PayloadError(f"tensor {name!r} cannot be encoded as {encoding}: {error}") from None
        encoded[name] = (tuple(values.shape), entries)
    if on_device is not None:
        encoded = on_device.to_host(encoded, buffer if buffer is not None else HostBuffer())
    return encoded, new_residual


def _device_codecs(arrays: dict, encoding: str):
    """wire/on_device.py when the arrays are torch tensors and it has a form of `encoding`, else None."""
    if not arrays or any(type(values).__module__.split(".")[0] != "torch" for values in arrays.values()):
        return None
    from . import on_device  # torch is imported: the arrays are its tensors

    return on_device if encoding in on_device.ENCODINGS else None
