"""The `slowlink plan` command: its options, its tables, its JSON, its PNG, and its errors."""

import json
import re
import sys
from functools import cache

import numpy as np
import pytest

from slowlink.cli.main import main
from slowlink.plan.plot import COLORS, DPI, SIZE_INCHES

PLAN_OPTIONS = {"--params", "--bandwidth", "--workers", "--step-time", "--layers", "--latency",
                "--sync-every", "--fragments", "--overlap-steps", "--tokens", "--batch-tokens", "--chips",
                "--peak-flops", "--mfu", "--target", "--model", "--json", "--plot"}  # fmt: skip
FG = ["plan", "--params", "1.5e9", "--step-time", "2.4", "--workers", "8", "--bandwidth",
      "100Mbps,200Mbps,1Gbps", "--sync-every", "100,500", "--tokens", "1e12",
      "--batch-tokens", "32768"]  # fmt: skip


def run(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_plan_help_lists_exactly_these_options(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["plan", "--help"])
    assert exit.value.code == 0
    # Pinned so that a renamed or removed option is a deliberate change (STYLE.md rule 13).
    assert set(re.findall(r"--[a-z][a-z-]*", capsys.readouterr().out)) == {*PLAN_OPTIONS, "--help"}


def test_the_text_plan_shows_utilization_time_needed_bandwidth_and_a_recommendation(capsys):
    code, out, _ = run(capsys, FG)
    assert code == 0
    assert out.startswith("slowlink plan: 1.5B parameters in 26 layers, 8 workers, 2.4 s of compute a step")
    # DiLoCo at H = 100: 36% at 100 Mbit/s and 53% at 200 Mbit/s, as in the FGDiLoCo blog.
    diloco = next(line for line in out.splitlines() if line.startswith("DiLoCo ") and " 100 " in line)
    assert diloco.split()[2:5] == ["36.4%", "53.5%", "85.6%"]
    globalm1 = next(
        line for line in out.splitlines() if line.startswith("FGDiLoCo GlobalM1") and "100.0%" in line
    )
    assert globalm1.split()[3:6] == ["57.1%", "100.0%", "100.0%"]
    assert "Time to train 1T tokens (32,768 tokens a worker a step, 3.81M steps)" in out
    assert re.search(r"FGDiLoCo GlobalM1\s+100\s+26\.5 weeks\s+15\.1 weeks", out)  # blog: ~16
    assert re.search(r"\nDiLoCo\s+100\s+41\.5 weeks\s+28\.3 weeks", out)  # blog: ~29 at 200 Mbit/s
    assert "Bandwidth needed for a compute utilization of" in out and "99%" in out
    assert re.search(r"Data-parallel \(DDP\)\s+1\s+10\.\d Gbit/s", out)  # needs ~10 Gbit/s for 50%
    assert "at 200 Mbit/s: Streaming + overlap + FP4, H=100, 9 fragments, τ=1, F4 (91.8%)" in out
    assert "use: sl.DiLoCo(sync_every=100, fragments=9, partition=sl.Strided(), overlap_steps=1" in out


@cache
def json_plan():
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main([*FG, "--json"]) == 0
    return json.loads(buffer.getvalue())


def test_the_json_plan_has_inputs_rows_and_recommendations():
    plan = json_plan()
    assert set(plan) == {"inputs", "rows", "recommendations"}
    inputs = plan["inputs"]
    assert inputs["params"] == 1.5e9 and inputs["layers"] == 26 and inputs["workers"] == 8
    assert inputs["bandwidths_bps"] == [100e6, 200e6, 1e9] and inputs["sync_every"] == [100, 500]
    by_key = {(r["method"]["name"], r["method"]["sync_every"]): r for r in plan["rows"]}
    assert len(by_key) == 11
    diloco = by_key[("diloco", 100)]
    assert diloco["utilization"][1] == pytest.approx(0.535, abs=0.005)
    assert set(diloco["bandwidth_needed_bps"]) == {"0.50", "0.80", "0.90", "0.95", "0.99"}
    assert 150e6 < diloco["bandwidth_needed_bps"]["0.50"] < 200e6
    assert by_key[("globalm1", 100)]["utilization"][1] == 1.0
    weeks = [s / 604800 for s in by_key[("globalm1", 100)]["train_seconds"]]
    assert weeks[1] == pytest.approx(15.1, abs=0.05)
    picks = plan["recommendations"]
    assert [p["bandwidth_bps"] for p in picks] == [100e6, 200e6, 1e9]
    assert all(p["reaches_target"] and p["utilization"] >= 0.9 and p["reason"] for p in picks)
    assert picks[0]["method"]["encoding"] == "F4" and picks[2]["config"].startswith("sl.DiLoCo(")


def test_the_plot_is_a_png_of_the_expected_size_with_one_coloured_line_per_method(tmp_path, capsys):
    from matplotlib import image

    png = tmp_path / "plots" / "plan.png"
    code, out, _ = run(capsys, [*FG, "--plot", str(png)])
    assert code == 0 and f"plot: {png}" in out
    pixels = image.imread(png)[..., :3]
    assert pixels.shape == (int(SIZE_INCHES[1] * DPI), int(SIZE_INCHES[0] * DPI), 3)
    assert pixels.std() > 0.05  # not blank
    for name, color in COLORS.items():
        rgb = np.array([int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)])
        near = np.abs(pixels - rgb).max(axis=-1) < 0.08
        assert near.sum() > 300, f"{name}'s line ({color}) is missing"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--bandwidth", "100Mbs"],
         "--bandwidth '100Mbs' is not a bandwidth: write a number and a unit, e.g. 100Mbps"),
        (["--params", "-5"], "--params '-5' must be positive, e.g. --params 1.5e9"),
        (["--step-time", "0"], "--step-time '0' must be positive"),
        (["--workers", "1"], "--workers 1 must be at least 2"),
        (["--fragments", "40"], "--fragments 40 exceeds --layers 26"),
        (["--overlap-steps", "100"], "--overlap-steps 100 must be below --sync-every 100"),
        (["--target", "150%"], "--target '150%' must be above 0 and at most 100%"),
        (["--tokens", "1e12"], "--tokens needs --batch-tokens"),
    ],
)  # fmt: skip
def test_bad_input_names_the_option_and_the_fix(capsys, argv, expected):
    base = {"--params": "1.5e9", "--step-time": "2.4", "--bandwidth": "100Mbps", "--sync-every": "100"}
    base.update(dict(zip(argv[::2], argv[1::2], strict=True)))
    code, out, err = run(capsys, ["plan", *[x for pair in base.items() for x in pair]])
    assert code == 1 and out == ""
    assert err.startswith("slowlink plan: error: ") and expected in err


def test_without_a_step_time_or_a_batch_the_error_says_how_to_give_one(capsys):
    code, _, err = run(capsys, ["plan", "--params", "1.5e9", "--bandwidth", "1Gbps"])
    assert code == 1 and "give --step-time" in err and "--batch-tokens" in err


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    argv = ["plan", "--params", "1e9", "--step-time", "0.1", "--bandwidth", "1Gbps"]
    code, _, err = run(capsys, [*argv, "--plot", str(tmp_path / "p.png")])
    assert code == 1 and "--plot needs matplotlib" in err and "pip install matplotlib" in err


def readme_command(name: str) -> list[str]:
    """The README's `slowlink NAME ...` line, as argv (its comment cut off)."""
    import shlex
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith(f"slowlink {name} "))
    return shlex.split(line.split("#")[0])[1:]


def test_the_readmes_plan_command_runs_and_prints_each_part(capsys):
    argv = readme_command("plan")
    code, out, _ = run(capsys, argv)
    assert code == 0
    assert out.startswith("slowlink plan: 1.5B parameters in 26 layers, 8 workers, 2.4 s of compute a step")
    header = next(line for line in out.splitlines() if line.startswith("method "))
    assert header.split()[2:] == ["100", "Mbit/s", "1", "Gbit/s"]  # one column per --bandwidth
    rows = {(line[:25].strip(), line.split()[-3]): line.split()[-2:] for line in out.splitlines()
            if line.endswith("%") and line[:25].strip() and line.split()[-3].isdigit()}  # fmt: skip
    assert rows[("DiLoCo", "100")] == ["36.4%", "85.6%"]  # FGDiLoCo's 36% at 100 Mbit/s
    assert rows[("Data-parallel (DDP)", "1")] == ["0.6%", "5.6%"]  # its "about 1%"
    assert len(rows) == 11  # DDP, then 5 methods at each of H = 100 and 500
    assert "Bandwidth needed for a compute utilization of" in out
    assert "at 100 Mbit/s: Streaming + overlap + FP4, H=100, 9 fragments, τ=4, F4 (94.2%)" in out
    assert "at 1 Gbit/s: Streaming + overlap, H=100, 9 fragments, τ=1, BF16 (96.7%)" in out
