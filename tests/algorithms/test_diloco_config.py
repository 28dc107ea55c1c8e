"""The DiLoCo configuration: defaults that just work, and errors that name the option and its range."""

import pytest

import slowlink as sl


def test_the_plain_configuration_is_standard_diloco_and_just_works():
    config = sl.DiLoCo(sync_every=100)
    assert (config.fragments, config.max_in_flight, config.outer_lr, config.outer_momentum) == (
        1,
        1,
        0.7,
        0.9,
    )
    assert config.to_dict()["sync_every"] == 100


def test_gradientmails_option_names_are_accepted():
    config = sl.DiLoCo(
        sync_every=100, fragments=8, in_flight=8, overlap_steps=1, mixing=0.5, merge=sl.WeightedMean(),
        quorum_size=2, partition=sl.Strided(), global_batch_size=256, delta_dtype="F4",
        flush_on_close=True,
    )  # fmt: skip
    assert config.to_dict()["partition"] == {"name": "Strided", "block_pattern": r"\.(\d+)\."}


@pytest.mark.parametrize(
    ("options", "named", "valid"),
    [
        ({"sync_every": 0}, "sync_every", ">= 1"),
        ({"sync_every": 10, "fragments": 11}, "fragments", "[1, 10]"),
        ({"sync_every": 10, "fragments": 2, "in_flight": 3}, "in_flight", "[1, 2]"),
        ({"sync_every": 10, "overlap_steps": 10}, "overlap_steps", "[0, 9]"),
        ({"sync_every": 10, "mixing": 1.0}, "mixing", "[0.0, 1.0)"),
        ({"sync_every": 10, "outer_lr": 0}, "outer_lr", "(0.0, 10.0]"),
        ({"sync_every": 10, "outer_momentum": -0.1}, "outer_momentum", "[0.0, 1.0)"),
        ({"sync_every": 10, "quorum_size": 0}, "quorum_size", ">= 1"),
        ({"sync_every": 10, "delta_dtype": "F3"}, "delta_dtype", "F4"),
        ({"sync_every": 2.5}, "sync_every", "integer"),
        ({"sync_every": 10, "fragments": 2, "in_flight": 1, "quorum_size": 2}, "in_flight=1", "deadlock"),
    ],
)
def test_an_invalid_option_is_refused_with_its_name_and_valid_range(options, named, valid):
    with pytest.raises(sl.ConfigError) as raised:
        sl.DiLoCo(**options)
    assert named in str(raised.value) and valid in str(raised.value)


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        sl.DiLoCo(100)
