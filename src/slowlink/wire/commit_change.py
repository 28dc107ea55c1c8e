"""A commit as its change: Θ_new = Θ_old + decode(encode(Θ_true − Θ_old + e)), in the run's commit encoding.

Every node, the merger included, adds exactly the decoded change to the parameters it holds, so all agree
bit for bit. The merger keeps what the encoding lost, e' = (Θ_true − Θ_old + e) − decoded, and adds it to
the next round's change (error feedback), so the commits' encoding error does not accumulate: over rounds
the committed parameters trail the merger's true ones by one residual, never by a sum of them.
"""

from ..arrays import Arrays
from . import payload
from .fragment import encode_fragment


def encode_change(
    params: Arrays, anchor: Arrays, residual: Arrays | None, encoding: str, header: dict
) -> tuple[Arrays, bytes, Arrays]:
    """(the committed parameters, the change's payload, the new residual). PayloadError when the change
    cannot be encoded (e.g. beyond F16's range): the commit then goes out in full."""
    change = {name: params[name] - anchor[name] for name in params}
    encoded, residual = encode_fragment(change, encoding, feedback=True, residual=residual)
    data = payload.pack_encoded(encoded, header | {"kind": "change"}, encoding=encoding)
    decoded, _ = payload.unpack(data)
    return {name: anchor[name] + decoded[name] for name in params}, data, residual
