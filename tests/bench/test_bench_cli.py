"""The `slowlink bench` command's options, pinned, and its refusals: each names the option and the fix, and
writes nothing."""

import json
import re
import shlex
from pathlib import Path

import pytest

import slowlink as sl
from slowlink.bench.config import PRESETS, BenchConfig, preset
from slowlink.cli.main import main

BENCH_OPTIONS = {"--steps", "--workers", "--sync-every", "--fragments", "--overlap-steps", "--batch-size",
                 "--step-time", "--bandwidth", "--lr", "--demo-lr", "--demo-topk", "--demo-decay", "--latency", "--seed", "--methods", "--jobs", "--quick", "--smoke",
                 "--model", "--exchange", "--out", "--help"}  # fmt: skip


def test_bench_help_lists_exactly_these_options(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["bench", "--help"])
    assert exit.value.code == 0
    assert set(re.findall(r"--[a-z][a-z-]*", capsys.readouterr().out)) == BENCH_OPTIONS


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--methods", "ddp,nope"], "--methods nope: no such method; choose from ddp, diloco"),
        (["--sync-every", "4", "--fragments", "5"], "--fragments 5 exceeds --sync-every 4"),
        (["--overlap-steps", "2"], "--overlap-steps 2 must lie in [0, H / fragments) = [0, 2)"),
        (["--bandwidth", "fast"], "--bandwidth 'fast' is not a bandwidth"),
        (["--workers", "1"], "--workers 1: a comparison of methods needs at least 2 workers"),
        (["--steps", "x"], "--steps 'x' is not a whole number"),
        (["--lr", "2"], "--lr 2.0 must lie in (0, 1), e.g. 1e-3"),
        (["--lr", "fast"], "--lr 'fast' is not a number: write e.g. --lr 1e-3"),
        (["--demo-decay", "1"], "--demo-decay 1.0 must lie in [0, 1), e.g. 0.99"),
        (["--demo-decay", "high"], "--demo-decay 'high' is not a number: write e.g. --demo-decay 0.99"),
    ],
)
def test_bad_options_are_refused_with_the_fix_and_nothing_is_written(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert main(["bench", "--smoke", "--out", str(out), *argv]) == 1
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_the_presets_are_valid_configs_and_a_change_is_checked_like_a_new_one():
    assert PRESETS["full"] == BenchConfig()
    # DeMo's lr, each the best of those tried on its preset's held-out loss (docs/BENCHMARKS.md, bench and bench-full)
    assert (PRESETS["full"].demo_lr, PRESETS["quick"].demo_lr, PRESETS["smoke"].demo_lr) == (1e-3, 1e-2, 1e-2)
    assert {PRESETS[name].demo_decay for name in PRESETS} == {0.99}  # the best β of those tried, at both
    assert preset("quick", steps=40).steps == 40
    with pytest.raises(sl.ConfigError, match="preset 'fast' is unknown; choose one of full, quick, smoke"):
        preset("fast")
    with pytest.raises(sl.ConfigError, match="--model 'huge' is unknown"):
        preset("smoke", model="huge")


def test_the_readmes_bench_command_is_the_quick_preset_of_every_method_into_slowlink_bench():
    from slowlink.bench.command import config_of
    from slowlink.bench.registry import METHODS
    from slowlink.bench.run import chosen
    from slowlink.cli.main import build_parser

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("slowlink bench "))
    argv = shlex.split(line.split("#")[0])[1:]
    assert argv == ["bench", "--quick"]
    config = config_of(build_parser().parse_args(argv))
    assert config == preset("quick", out="slowlink-bench")  # the README's "into `slowlink-bench/`"
    assert chosen(config) == list(METHODS)  # "the methods side by side": all 13
    assert len(METHODS) == 13


def test_seed_demo_topk_and_demo_decay_reach_the_run_and_a_seed_reproduces_it(tmp_path):
    outcomes = {}
    for name, argv in {
        "seed 0": [],
        "seed 0 again": [],
        "seed 1": ["--seed", "1"],
        "k 8": ["--demo-topk", "8"],
        "β 0.999": ["--demo-decay", "0.999"],
    }.items():
        out = tmp_path / name.replace(" ", "-")
        assert main(["bench", "--smoke", "--methods", "demo", "--jobs", "1", "--out", str(out), *argv]) == 0
        (outcomes[name],) = json.loads((out / "results.json").read_text())["outcomes"]
    for outcome in outcomes.values():  # the run's own timings: the only numbers that may differ
        del outcome["cpu_seconds"], outcome["real_seconds"]
    assert outcomes["seed 0"] == outcomes["seed 0 again"]  # every number, the curve's included
    assert outcomes["seed 1"]["heldout_loss"] != outcomes["seed 0"]["heldout_loss"]
    assert outcomes["β 0.999"]["heldout_loss"] != outcomes["seed 0"]["heldout_loss"]  # the preset's is 0.99
    # twice the coefficients per chunk: the packed bytes nearly double (each frame's header is paid once)
    assert 1.7 < outcomes["k 8"]["bytes_per_worker"] / outcomes["seed 0"]["bytes_per_worker"] < 2.0


def test_lr_is_the_peak_of_every_adamw_the_bench_builds_and_moves_ddp_and_diloco(tmp_path):
    from slowlink.bench.run import make_task

    task = make_task(preset("smoke", lr=3e-3))
    optimizer = task.optimizer(task.make_model().parameters())
    assert optimizer.peaks == [3e-3, 3e-3]  # both groups: decayed matrices and the rest
    losses = {}
    for name, argv in {"default": [], "3e-3": ["--lr", "3e-3"]}.items():
        out = tmp_path / name
        argv = ["bench", "--smoke", "--methods", "ddp,diloco", "--jobs", "1", "--out", str(out), *argv]
        assert main(argv) == 0
        outcomes = json.loads((out / "results.json").read_text())["outcomes"]
        losses[name] = {outcome["name"]: outcome["heldout_loss"] for outcome in outcomes}
    assert losses["default"].keys() == {"ddp", "diloco"}
    for method in ("ddp", "diloco"):
        assert losses["3e-3"][method] != losses["default"][method]
