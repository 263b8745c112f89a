"""benchmarks/sim_throughput.py still runs and prints its table (its figures are not
checked here: speed targets belong in the benchmark's printed output, not in tests)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_sim_throughput_prints_a_row_per_scenario():
    out = subprocess.run(
        [
            sys.executable,
            "benchmarks/sim_throughput.py",
            "--skip-large",
            "--no-outputs",
            "--repeats",
            "1",
            "--bare-events",
            "20000",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("bare simpy loop:") and "one event-log record costs" in lines[0], lines[0]
    header = next(line for line in lines if line.startswith("scenario"))
    columns = header.split()
    for label in ("2-GPU default", "64-GPU mixed"):
        row = next((line for line in lines if line.startswith(label)), None)
        assert row is not None, out.stdout
        cells = row[len(label) :].split()
        assert cells[0] == "done", row  # the run ended because its pipelines finished
        events, records = int(cells[1]), int(cells[2])
        assert events > 0 and records > 1, row  # a run logs more than its header
    assert "loop+log" in columns and "1024-GPU" not in out.stdout
