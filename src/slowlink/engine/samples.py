"""What a step reports it trained on, checked once for every driver: a non-negative count of samples."""

import operator

from ..errors import ConfigError


def count_of(samples: object) -> int:
    """`samples` as a non-negative int: an int, or anything operator.index takes (np.int64, a one-element
    integer tensor); a bool (or bool tensor) is refused, it is a flag, not a count."""
    is_flag = isinstance(samples, bool) or str(getattr(samples, "dtype", "")) in ("bool", "torch.bool")
    try:
        count = None if is_flag else operator.index(samples)
    except TypeError:
        count = None
    if count is None or count < 0:
        raise ConfigError(
            f"session.step(samples={samples!r}): samples must be a non-negative integer (an int, a numpy "
            "integer or a one-element integer tensor): the sequences or tokens that step trained on"
        )
    return count
