"""`slowlink bench --smoke` end to end: the table's rows and columns, numbers that hold what each method
guarantees (bytes by H, by fragments, by encoding; DDP's utilization from its link by hand; who waits and who
does not), the JSON, and a PNG that decodes to the expected size with a drawing on it. One run for all."""

import contextlib
import io
import json
import math
import re

import numpy as np
import pytest
from PIL import Image
from rich.console import Console

from slowlink.bench.config import PRESETS, SYNC_STEPS, preset
from slowlink.bench.outcome import Outcome
from slowlink.bench.registry import METHODS
from slowlink.bench.report import COLUMNS, LiveView
from slowlink.bench.run import run_bench
from slowlink.cli.main import main

SMOKE = PRESETS["smoke"]
UNTRAINED = math.log(256)  # a byte model that knows nothing: uniform over 256 bytes


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # not a terminal: the display prints plain lines
        assert main(["bench", "--smoke", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    return out, printed.getvalue(), {o["name"]: o for o in results["outcomes"]}, results


def cells(table: str) -> list[list[str]]:
    rows = [line for line in table.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_the_table_has_every_method_as_a_row_and_the_issues_columns(bench):
    out, printed, _, _ = bench
    table = (out / "table.md").read_text()
    assert table in printed  # what was printed is what was written
    header, rule, *rows = cells(table)
    assert header == COLUMNS and set(rule) == {"---"}
    assert [row[0] for row in rows] == list(METHODS)
    for row in rows:
        assert 0 < float(row[1]) < UNTRAINED, row  # held-out loss: finite, and it learned
        assert re.fullmatch(r"\d+%", row[7]) and 0 < int(row[7][:-1]) <= 100, row
    assert f"{SMOKE.workers} workers × {SMOKE.steps} steps" in table
    assert all(f"- `{name}`: {entry.summary}" in table for name, entry in METHODS.items())


def test_bytes_divide_as_each_method_promises(bench):
    _, _, o, _ = bench
    # DiLoCo moves DDP's bytes once every H steps instead of every step (the Δ payload's header aside)
    assert o["ddp"]["bytes_per_worker"] / o["diloco"]["bytes_per_worker"] == pytest.approx(
        SMOKE.sync_every, rel=0.05
    )
    # Streaming: the same bytes in all, but a sync carries one fragment of P (balanced by bytes)
    ratio = o["diloco"]["peak_bytes_per_sync"] / o["streaming"]["peak_bytes_per_sync"]
    assert ratio == pytest.approx(SMOKE.fragments, rel=0.1)
    # F4: four bits a value instead of 32, plus the payload's scales and header
    assert o["streaming-f4"]["bytes_per_worker"] < o["streaming"]["bytes_per_worker"] / 5
    # DeMo's top-k coefficients: at least 85× fewer bytes than DDP's gradients
    assert o["ddp"]["bytes_per_worker"] / o["demo"]["bytes_per_worker"] >= 85
    for outcome in o.values():
        assert (
            outcome["bytes_sent"] > 0 and outcome["samples"] == SMOKE.workers * SMOKE.steps * SMOKE.batch_size
        )


def test_time_and_utilization_follow_the_link_and_the_waiting(bench):
    _, _, o, results = bench
    # The derived link makes one fp32 all-reduce of the model take SYNC_STEPS steps: DDP computes 1 s in 91
    assert o["ddp"]["utilization"] == pytest.approx(1 / (1 + SYNC_STEPS), rel=1e-6)
    assert o["ddp"]["simulated_seconds"] == pytest.approx(SMOKE.steps * SMOKE.step_time * (1 + SYNC_STEPS))
    ring = 2 * (SMOKE.workers - 1) / SMOKE.workers
    assert results["bandwidth"] == pytest.approx(
        ring
        * 8
        * 4
        * results["parameters"]
        / (SYNC_STEPS * SMOKE.step_time - 2 * (SMOKE.workers - 1) * SMOKE.latency)
    )
    assert (
        o["ddp"]["simulated_seconds"]
        > o["diloco"]["simulated_seconds"]
        > o["streaming-f4"]["simulated_seconds"]
    )
    # without a barrier nobody waits for the slow half; with it, everyone does
    assert o["decoupled-1:2"]["simulated_seconds"] < o["diloco-1:2"]["simulated_seconds"]
    assert o["decoupled"]["utilization"] > o["diloco"]["utilization"]
    # a barrier that waits for every worker: the slow half changes the time, never the training
    assert o["diloco-1:2"]["heldout_loss"] == o["diloco"]["heldout_loss"]
    assert o["diloco-1:2"]["curve"][-1][2] == o["diloco"]["curve"][-1][2]
    assert o["diloco-1:2"]["simulated_seconds"] > o["diloco"]["simulated_seconds"]
    for outcome in o.values():
        steps = [step for step, _, _ in outcome["curve"]]
        times = [time for _, time, _ in outcome["curve"]]
        assert steps == list(range(1, SMOKE.steps + 1)) and times == sorted(times)
        assert all(math.isfinite(loss) for _, _, loss in outcome["curve"])


def test_the_png_decodes_to_three_drawn_panels(bench):
    out, printed, _, _ = bench
    assert f"{out / 'bench.png'}" in printed
    image = np.asarray(Image.open(out / "bench.png").convert("RGB"))
    assert image.shape == (450, 1500, 3)  # figsize (15, 4.5) at 100 dpi
    drawn = (image < 250).any(axis=2)
    assert 0.02 < drawn.mean() < 0.6  # axes, curves and bars; not blank, not filled
    for third in np.array_split(drawn, 3, axis=1):  # every panel has something drawn
        assert third.mean() > 0.01
    colours = {tuple(pixel) for pixel in image.reshape(-1, 3)[::7]}
    assert len(colours) > len(METHODS)  # one colour per method, at least


def test_the_display_prints_plain_lines_off_a_terminal(bench):
    _, printed, o, _ = bench
    assert "files: " in printed
    for name in METHODS:
        assert f"bench: {name} done: held-out {o[name]['heldout_loss']:.4f}" in printed


def test_through_a_store_a_workers_bytes_are_its_puts_of_each_round_and_gets_of_each_commit():
    config = preset("smoke", methods=("diloco",), exchange="store")
    result = run_bench(config, Quiet())
    (diloco,) = result.outcomes
    rounds = SMOKE.steps // SMOKE.sync_every
    assert diloco.syncs == rounds
    # every round, each worker PUTs its Δ (the peak, computed from the method's plan) and GETs the commit
    assert diloco.bytes_sent == rounds * diloco.peak_bytes_per_sync
    assert diloco.bytes_received >= rounds * 4 * result.parameters  # the committed parameters, fp32


def test_on_a_terminal_the_live_table_shows_each_methods_progress_and_result():
    screen = io.StringIO()
    view = LiveView(Console(file=screen, force_terminal=True, width=160))
    view.start(["ddp", "diloco"])
    view.progress("ddp", 3, 8)
    view.done(Outcome("ddp", 2.5, [(1, 1.0, 3.0)], 10, 10, 5, 60.0, 0.5, 16, 1, real_seconds=2.0))
    view.end()
    text = screen.getvalue()
    assert "slowlink bench" in text and "3/8" in text and "held-out 2.5000, 60 s simulated" in text
    assert "bench: ddp done" not in text  # the plain lines are for pipes and files only


class Quiet:
    def start(self, names): ...
    def begin(self, name, summary): ...
    def progress(self, name, done, total): ...
    def done(self, outcome): ...
    def end(self): ...
