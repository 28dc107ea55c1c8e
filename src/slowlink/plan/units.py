"""Quantities people type on the command line: "100Mbps", "2.4s", "1.5B", "90%", "100,500".

Each parser names the option it reads; a bad value raises ConfigError with the rule and an example of
the fix. Formatters turn bits/s and seconds back into short text. Nothing here knows about methods.
"""

import math
import re

from ..errors import ConfigError

_NUMBER = r"([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BYTE_UNITS = ("Bps", "B/s", "byte/s", "bytes/s")
_BANDWIDTH = re.compile(rf"^{_NUMBER}\s*([kKmMgGtT]?)(bps|bits?/s|b/s|Bps|B/s|bytes?/s)$")
_DURATION = re.compile(rf"^{_NUMBER}\s*(s|ms|us|µs|min|h)?$")
_DURATION_SCALE = {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "min": 60.0, "h": 3600.0}
_COUNT = re.compile(rf"^{_NUMBER}\s*([kKmMbBgGtT]?)$")
_COUNT_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_bandwidth(option: str, text: str) -> float:
    """One bandwidth in bits per second: "100Mbps", "1Gbps", "1.5 Gbit/s", "12.5MB/s" (bytes)."""
    match = _BANDWIDTH.match(text.strip())
    if match is None:
        raise ConfigError(
            f"{option} {text!r} is not a bandwidth: write a number and a unit, e.g. 100Mbps, 1Gbps or "
            "1.5Gbit/s (bits per second; MB/s for bytes per second)"
        )
    value, prefix, unit = float(match[1]), match[2].lower(), match[3]
    bits = value * _PREFIX[prefix] * (8.0 if unit in _BYTE_UNITS else 1.0)
    if not math.isfinite(bits) or bits <= 0:
        raise ConfigError(f"{option} {text!r} must be a positive bandwidth, e.g. 100Mbps")
    return bits


def parse_bandwidths(option: str, text: str) -> list[float]:
    """A comma-separated list of bandwidths, each in bits per second, in the order given."""
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise ConfigError(f"{option} needs at least one bandwidth, e.g. {option} 100Mbps,1Gbps")
    return [parse_bandwidth(option, part) for part in parts]


def parse_duration(option: str, text: str, *, allow_zero: bool = False) -> float:
    """Seconds from "2.4", "2.4s", "350ms", "20us", "5min"; a bare number is in seconds."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ConfigError(f"{option} {text!r} is not a duration: write seconds, e.g. 2.4 or 2.4s or 350ms")
    seconds = float(match[1]) * _DURATION_SCALE[match[2]]
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        rule = "at least 0" if allow_zero else "positive"
        raise ConfigError(f"{option} {text!r} must be {rule}, e.g. {option} 2.4s")
    return seconds


def parse_count(option: str, text: str, *, example: str = "1.5e9") -> float:
    """A positive count: "1.5e9", "1.5B", "350M", "32k", "1T" (k, M, B or G, T; case-insensitive)."""
    match = _COUNT.match(text.strip())
    if match is None:
        raise ConfigError(
            f"{option} {text!r} is not a number: write e.g. {option} {example} (suffixes k, M, B, T allowed)"
        )
    value = float(match[1]) * _COUNT_SCALE[match[2].lower()]
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{option} {text!r} must be positive, e.g. {option} {example}")
    return value


def parse_int(option: str, text: str, *, low: int = 1) -> int:
    """An integer of at least `low`."""
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(f"{option} {text!r} is not a whole number, e.g. {option} {max(low, 8)}") from None
    if value < low:
        raise ConfigError(f"{option} {value} must be at least {low}")
    return value


def parse_int_list(option: str, text: str, *, low: int = 1) -> list[int]:
    """Comma-separated integers, each at least `low`, duplicates dropped, in the order given."""
    values = [parse_int(option, part, low=low) for part in text.split(",") if part.strip()]
    if not values:
        raise ConfigError(f"{option} needs at least one value, e.g. {option} 100,500")
    return list(dict.fromkeys(values))


def parse_fraction(option: str, text: str) -> float:
    """A fraction in (0, 1]: "90%" or "0.9"."""
    stripped = text.strip()
    try:
        value = float(stripped[:-1]) / 100 if stripped.endswith("%") else float(stripped)
    except ValueError:
        raise ConfigError(f"{option} {text!r} is not a fraction: write e.g. {option} 90% or 0.9") from None
    if not 0 < value <= 1:
        raise ConfigError(f"{option} {text!r} must be above 0 and at most 100%, e.g. {option} 90%")
    return value


def format_bandwidth(bits_per_second: float | None) -> str:
    """ "100 Mbit/s", "1.2 Gbit/s"; None (not reachable at any bandwidth) is "never"."""
    if bits_per_second is None:
        return "never"
    for scale, name in ((1e12, "Tbit/s"), (1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if bits_per_second >= scale:
            return f"{_three_digits(bits_per_second / scale)} {name}"
    return f"{_three_digits(bits_per_second)} bit/s"


def format_duration(seconds: float) -> str:
    """Seconds as the largest sensible unit: "16.0 weeks", "3.5 days", "4.2 h", "12 min", "2.4 s"."""
    for scale, name in ((7 * 86400.0, "weeks"), (86400.0, "days"), (3600.0, "h"), (60.0, "min")):
        if seconds >= 2 * scale:
            return f"{seconds / scale:.1f} {name}"
    return f"{seconds:.3g} s"


def format_percent(fraction: float) -> str:
    """ "90%", "99.9%": as many decimals as the value needs, up to two."""
    for digits in (0, 1):
        text = f"{fraction:.{digits}%}"
        if abs(float(text[:-1]) / 100 - fraction) < 1e-12:
            return text
    return f"{fraction:.2%}"


def format_count(value: float) -> str:
    """ "1.5B", "350M", "32.8k", "1T", "512"."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _three_digits(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"
