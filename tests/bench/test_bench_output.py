"""`slowlink bench --smoke` end to end: the table's rows and columns, numbers that hold what each method
guarantees (bytes by H, by fragments, by encoding; DDP's utilization from its link by hand; who waits and who
does not), the JSON, and a PNG that decodes to the expected size with a drawing on it. One run for all."""

import contextlib
import io
import json
import math
import re

import matplotlib.image as plt_image
import numpy as np
import pytest
from PIL import Image
from rich.console import Console

from slowlink.bench.config import PRESETS, SYNC_STEPS, preset
from slowlink.bench.outcome import Outcome
from slowlink.bench.registry import METHODS
from slowlink.bench.report import COLUMNS, LiveView, colours, markdown_table
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
    # TopK: 1/64 of each chunk, 2-bit values and Rice-coded indices, against fp32 Δs
    assert o["diloco-topk"]["bytes_per_worker"] < o["diloco"]["bytes_per_worker"] / 10
    # gossip: a round per H steps (NoLoCo's H/2); GlobalM1 moves no Δ, so fewer bytes than with a Mix2
    assert o["gossip-m1"]["syncs"] == SMOKE.steps // SMOKE.sync_every
    assert o["noloco"]["syncs"] == SMOKE.steps // (SMOKE.sync_every // 2)
    assert o["gossip-m1"]["bytes_per_worker"] < o["gossip-m1-m2pairs"]["bytes_per_worker"]
    # with two workers a pair is the whole roster: LocalM1M2 is GlobalM1LocalM2, number for number
    assert {
        k: v for k, v in o["gossip-pairs"].items() if k not in ("name", "real_seconds", "cpu_seconds")
    } == {k: v for k, v in o["gossip-m1-m2pairs"].items() if k not in ("name", "real_seconds", "cpu_seconds")}
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
    # GlobalM1 mixes the starts while it trains, where DiLoCo's barrier waits for its all-reduce
    assert o["gossip-m1"]["simulated_seconds"] < o["diloco"]["simulated_seconds"]
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


def test_the_png_decodes_to_three_drawn_panels_with_every_methods_colour(bench):
    out, printed, _, _ = bench
    assert f"{out / 'bench.png'}" in printed
    image = np.asarray(Image.open(out / "bench.png").convert("RGB"))
    assert image.shape == (450, 1500, 3)  # figsize (15, 4.5) at 100 dpi
    as_read = plt_image.imread(out / "bench.png")  # matplotlib reads it back, as floats in [0, 1]
    assert as_read.shape[:2] == (450, 1500) and np.allclose(as_read[..., :3] * 255, image, atol=1)
    drawn = (image < 250).any(axis=2)
    assert 0.02 < drawn.mean() < 0.6  # axes, curves and bars; not blank, not filled
    for third, panel in zip(
        np.array_split(drawn, 3, axis=1), np.array_split(as_read, 3, axis=1), strict=True
    ):
        assert third.mean() > 0.01 and panel[..., :3].var() > 1e-3  # every panel has something drawn
    # every method's own colour, distinct from the others', is drawn: its bar in the bytes panel at least
    palette = [tuple(round(255 * c) for c in colour) for colour in colours(len(METHODS))]
    assert len(set(palette)) == len(METHODS)
    seen = {tuple(pixel) for pixel in image.reshape(-1, 3)}
    assert all(colour in seen for colour in palette), [c for c in palette if c not in seen]


def shown(cell: str, value: float) -> bool:
    """Whether a table cell ("15.1 MB", "698 bytes", "18.4 min", "+4.7%", "20×") shows `value`: within half
    its last digit."""
    scales = {"bytes": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "s": 1, "min": 60, "h": 3600, "days": 86400}
    number, _, unit = cell.replace(",", "").rstrip("×%").partition(" ")
    scale = scales.get(unit, 1) / (100 if cell.endswith("%") else 1)
    decimals = len(number.partition(".")[2])
    return abs(float(number) * scale - value) <= (0.5 * 10**-decimals + 1e-9) * scale


def test_every_cell_of_the_table_is_its_runs_number_in_results_json(bench):
    out, _, o, _ = bench
    _, _, *rows = cells((out / "table.md").read_text())
    ddp = o["ddp"]
    for name, loss, vs_ddp, moved, fewer, peak, seconds, utilization in rows:
        run = o[name]
        assert shown(loss, run["heldout_loss"]), (name, loss)
        assert shown(vs_ddp, run["heldout_loss"] / ddp["heldout_loss"] - 1), (name, vs_ddp)
        assert shown(moved, run["bytes_per_worker"]), (name, moved)
        assert shown(fewer, ddp["bytes_per_worker"] / run["bytes_per_worker"]), (name, fewer)
        assert shown(peak, run["peak_bytes_per_sync"]), (name, peak)
        assert shown(seconds, run["simulated_seconds"]), (name, seconds)
        assert shown(utilization, run["utilization"]), (name, utilization)


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


def test_each_method_that_ends_is_saved_with_those_still_to_run_named(tmp_path):
    saved = []
    config = preset("smoke", methods=("diloco", "streaming"), jobs=1)
    result = run_bench(config, Quiet(), save=lambda so_far: saved.append(so_far))
    assert [[o.name for o in r.outcomes] for r in saved] == [["diloco"], ["diloco", "streaming"]]
    assert [r.unfinished for r in saved] == [["streaming"], []]
    assert saved[-1].outcomes == result.outcomes and result.unfinished == []
    assert "Not finished (yet): streaming." in markdown_table(saved[0])
    assert "Not finished" not in markdown_table(result)


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
