"""benchmarks/streamed_parts.py: every part of the streamed run timed once (the parts add
up to the whole process), each reader's pushes counted, and bad input refused in one line.
No timing is asserted: the figures belong in the printed output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.sim.benchmark_module import ROOT, load_benchmark

SMALL = "examples/scenarios/mixed_16gpu_expected.yaml"


def _run(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmarks/streamed_parts.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )


def test_parts_add_up_to_the_whole_process(tmp_path):
    report = tmp_path / "parts.json"
    out = _run("--scenario", SMALL, "--rounds", "2", "--json", str(report))
    assert out.returncode == 0, out.stderr[-3000:]
    runs = json.loads(report.read_text())["this"]
    assert len(runs) == 2
    parts = load_benchmark("streamed_parts").PARTS
    for run in runs:
        assert set(run["parts"]) == set(parts), run["parts"]
        assert run["missing"] == []  # every function the tool wraps is found on this tree
        assert all(s >= 0 for s in run["parts"].values()), run["parts"]
        # the parts that must have cost something in any run
        for name in ("imports", "simulation", "readers", "encoding", "split", "trace", "summary", "ends"):
            assert run["parts"][name] > 0, (name, run["parts"])
        assert run["parts"]["picture"] == 0  # --no-png by default
        whole = run["whole"]["cpu"]
        # each CPU second counted once: the parts' sum within 2 % (or 20 ms) of the process's
        assert abs(sum(run["parts"].values()) - whole) <= max(0.02, 0.02 * whole), (run["parts"], whole)
        # each reader's pushes, named by its owner, add up to the readers' part
        assert any(r.startswith("oracle: ") for r in run["readers"]) and any(
            r.startswith("view: ") for r in run["readers"]
        )
        assert sum(run["readers"].values()) == pytest.approx(run["parts"]["readers"], abs=1e-6)
        assert run["records"] > 1000
    printed = out.stdout
    for text in parts.values():
        if "readers" not in text:
            assert text in printed, text
    assert "one-pass readers" in printed and "all readers" in printed and "the whole process" in printed


def test_the_picture_is_a_part_when_drawn(tmp_path):
    report = tmp_path / "parts.json"
    out = _run("--scenario", "examples/scenarios/default.yaml", "--png", "--json", str(report))
    assert out.returncode == 0, out.stderr[-3000:]
    run = json.loads(report.read_text())["this"][0]
    assert run["parts"]["picture"] > 0
    assert abs(sum(run["parts"].values()) - run["whole"]["cpu"]) <= max(0.02, 0.02 * run["whole"]["cpu"])


@pytest.mark.parametrize(
    "args, said",
    [
        (["--scenario", "examples/scenarios/no_such_scenario.yaml"], "no such file"),
        (["--gpus", "100"], "--gpus"),
        (["--gpus", "many"], "--gpus"),
        (["--rounds", "0"], "--rounds"),
        (["--other", "/nonexistent/tree"], "--other"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, said):
    out = _run(*args, timeout=60)
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], out.stderr
    assert out.stdout == ""


def test_a_scenario_the_command_refuses_is_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\npipelines: 3\n")
    out = _run("--scenario", str(bad), timeout=60)
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr


def test_a_wrapped_call_keeps_its_own_time_only(monkeypatch):
    bench = load_benchmark("streamed_parts")
    clock = iter(range(100))
    monkeypatch.setattr(bench.time, "process_time", lambda: float(next(clock)))
    parts = bench.Parts()
    inner = parts.timed(lambda: None, "encoding")  # 1 tick
    outer = parts.timed(lambda: inner(), lambda: ("readers", "oracle: x"))
    outer()  # outer: ticks 0..3 (3), inner: 1..2 (1)
    assert parts.cpu["encoding"] == 1 and parts.cpu["readers"] == 2 and parts.readers == {"oracle: x": 2}
    assert parts.stack == []


def test_a_call_left_open_is_refused():
    bench = load_benchmark("streamed_parts")
    parts = bench.Parts()
    leaky = parts.timed(lambda: parts.stack.append(["split", 0.0, 0.0, None]), "ends")  # a frame never closed
    with pytest.raises(RuntimeError, match="unbalanced"):
        leaky()


def test_a_function_the_tree_lacks_is_noted_not_wrapped():
    bench = load_benchmark("streamed_parts")
    parts = bench.Parts()

    class Old:
        def run(self):
            return 1

    assert parts.patch(Old, "run", "simulation", "Old") is not None
    assert parts.patch(Old, "finish", "ends", "Old") is None
    assert parts.missing == ["Old.finish"] and Old().run() == 1


def test_a_scaled_scenario_by_its_gpus():
    out = _run("--gpus", "64", "--steps", "5", "--top", "3")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("64 GPUs (benchmarks/scale_scenarios.py): ")
    assert "the whole process" in out.stdout and "all readers" in out.stdout
