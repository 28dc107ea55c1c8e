"""What people type, read back as numbers; and what a typo gets told."""

import pytest

from slowlink.errors import ConfigError
from slowlink.plan import units


@pytest.mark.parametrize(
    ("text", "bits"),
    [("100Mbps", 100e6), ("1Gbps", 1e9), ("1.5 Gbit/s", 1.5e9), ("200mbps", 200e6), ("12.5MB/s", 100e6),
     ("10Gb/s", 10e9), ("2e3kbps", 2e6), ("1Tbps", 1e12)],
)  # fmt: skip
def test_a_bandwidth_is_bits_per_second_and_capital_b_means_bytes(text, bits):
    assert units.parse_bandwidth("--bandwidth", text) == pytest.approx(bits)


def test_a_bandwidth_list_keeps_its_order():
    assert units.parse_bandwidths("--bandwidth", "100Mbps,200Mbps, 1Gbps") == [100e6, 200e6, 1e9]


@pytest.mark.parametrize("text", ["100Mbs", "100", "fast", "100 Mbps/s", "1e9 bit"])
def test_a_bandwidth_without_a_known_unit_names_the_option_and_shows_the_fix(text):
    with pytest.raises(ConfigError) as error:
        units.parse_bandwidth("--bandwidth", text)
    assert f"--bandwidth {text!r} is not a bandwidth" in str(error.value) and "100Mbps" in str(error.value)


@pytest.mark.parametrize("text", ["-100Mbps", "0Gbps"])
def test_a_bandwidth_must_be_positive(text):
    with pytest.raises(ConfigError, match="must be a positive bandwidth"):
        units.parse_bandwidth("--bandwidth", text)


@pytest.mark.parametrize(
    ("text", "value"),
    [("1.5e9", 1.5e9), ("1.5B", 1.5e9), ("350M", 350e6), ("32k", 32e3), ("1T", 1e12), ("7G", 7e9)],
)
def test_counts_take_the_usual_suffixes(text, value):
    assert units.parse_count("--params", text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["-5", "0", "-1.5e9"])
def test_a_count_must_be_positive(text):
    with pytest.raises(ConfigError, match=rf"--params '{text}' must be positive, e.g. --params 1.5e9"):
        units.parse_count("--params", text)


def test_durations_default_to_seconds():
    assert units.parse_duration("--step-time", "2.4") == 2.4
    assert units.parse_duration("--step-time", "350ms") == pytest.approx(0.35)
    assert units.parse_duration("--latency", "0", allow_zero=True) == 0.0
    with pytest.raises(ConfigError, match="--step-time '0' must be positive"):
        units.parse_duration("--step-time", "0")
    with pytest.raises(ConfigError, match="--latency '30 parsecs' is not a duration"):
        units.parse_duration("--latency", "30 parsecs", allow_zero=True)


def test_fractions_take_percent_or_a_plain_number():
    assert units.parse_fraction("--target", "90%") == pytest.approx(0.9)
    assert units.parse_fraction("--target", "0.95") == 0.95
    with pytest.raises(ConfigError, match="at most 100%"):
        units.parse_fraction("--target", "120%")


def test_integer_lists_drop_repeats_and_refuse_zero():
    assert units.parse_int_list("--sync-every", "100,500,100") == [100, 500]
    with pytest.raises(ConfigError, match="--sync-every 0 must be at least 1"):
        units.parse_int_list("--sync-every", "0")
    with pytest.raises(ConfigError, match="--workers 'eight' is not a whole number"):
        units.parse_int("--workers", "eight")


def test_formatting_reads_back_as_people_write_it():
    assert units.format_bandwidth(100e6) == "100 Mbit/s"
    assert units.format_bandwidth(1.234e9) == "1.23 Gbit/s"
    assert units.format_bandwidth(None) == "never"
    assert units.format_duration(16 * 7 * 86400) == "16.0 weeks"
    assert units.format_duration(3 * 86400) == "3.0 days"
    assert units.format_duration(2.4) == "2.4 s"
    assert units.format_count(1.5e9) == "1.5B" and units.format_count(1e12) == "1T"
    assert units.format_percent(0.9) == "90%" and units.format_percent(0.999) == "99.9%"
