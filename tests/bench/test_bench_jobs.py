"""`slowlink bench --jobs 2` as a real process: a SIGTERM to the bench alone, while both jobs train, leaves
no process of it behind (a killed parent runs no cleanup, so each job process must notice by itself)."""

import contextlib
import signal
import subprocess
import sys
import time

import psutil

BEGUN = "bench: "  # the plain display's line as a job begins a method


def test_a_terminated_bench_leaves_no_job_process_running(tmp_path):
    # steps enough that neither job can end before the signal (the micro model does ~1,000 steps a second)
    argv = [sys.executable, "-m", "slowlink.cli.main", "bench", "--smoke", "--steps", "200000",
            "--methods", "ddp,diloco", "--jobs", "2", "--out", str(tmp_path / "out")]  # fmt: skip
    bench = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children: list[psutil.Process] = []
    try:
        begun = []
        while len(begun) < 2:  # both jobs are inside a method: their processes are up and training
            line = bench.stdout.readline()
            assert line, f"the bench ended before both jobs began: {begun}"
            if line.startswith(BEGUN) and line.rstrip().endswith("..."):
                begun.append(line.split()[1])
        assert sorted(begun) == ["ddp", "diloco"]
        children = psutil.Process(bench.pid).children(recursive=True)
        assert len(children) >= 2  # the two job processes (and multiprocessing's resource tracker)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=30) == -signal.SIGTERM
        began = time.monotonic()
        _, alive = psutil.wait_procs(children, timeout=15)
        assert alive == [], f"still running {time.monotonic() - began:.0f} s after the bench: {alive}"
    finally:  # a failed check leaves nothing training either
        bench.kill()
        for process in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
