"""The pytest plugin: its fixtures, its markers, and the README example run as a user would.

The README's example is copied into an empty directory and run there by a fresh pytest
process that knows nothing of this repository's configuration: it must pass on the
plugin alone (found through the ``pytest11`` entry point an install registers).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from rlharness.pytest_plugin import apply_overrides

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def readme_example() -> str:
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    m = re.search(r"<!-- pytest-plugin-example -->\s*```python\n(.*?)```", text, re.S)
    assert m, "README.md lost its pytest plugin example"
    return m.group(1)


def _plugin_args():
    """How a subprocess gets the plugin: through the installed entry point (a fresh
    install, as in CI), or, in a development environment installed before the entry
    point existed, by naming the module."""
    installed = any(
        ep.name == "rlharness" and ep.value == "rlharness.pytest_plugin" for ep in entry_points(group="pytest11")
    )
    if installed:
        return []
    if os.environ.get("CI"):
        pytest.fail("CI installs rlharness fresh: its pytest11 entry point 'rlharness' must be registered")
    return ["-p", "rlharness.pytest_plugin"]


def run_pytest_in(directory, *args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *_plugin_args(), *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_pyproject_registers_the_plugin_entry_point():
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    assert re.search(r'\[project\.entry-points\.pytest11\]\s*\nrlharness = "rlharness\.pytest_plugin"', text)


def test_readme_example_passes_and_a_failing_assertion_fails_and_markers_skip_in_a_fresh_session(tmp_path):
    """One fresh pytest process in an otherwise empty directory (no configuration of this
    repository), holding the README's example and a file of our own: the example's tests
    pass, a wrong expectation fails, a gpu-marked test skips with its reason on a machine
    without CUDA (one session for both files: a pytest start with the plugin is ~1 CPU s)."""
    (tmp_path / "test_my_scenarios.py").write_text(readme_example())
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "def test_wrong_expectation(rlharness_run):\n"
        "    assert rlharness_run(overrides={'pipelines[0].steps': 1}).reason == 'failed'\n"
        "@pytest.mark.gpu\n"
        "def test_needs_gpu():\n"
        "    pass\n"
    )
    proc = run_pytest_in(tmp_path, "-rA")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    outcomes = [
        line.split(" ", 1)
        for line in proc.stdout.splitlines()
        if line.startswith(("PASSED ", "FAILED ", "SKIPPED ", "ERROR "))
    ]
    readme = [o for o, rest in outcomes if rest.startswith("test_my_scenarios.py::")]
    assert readme == ["PASSED", "PASSED"], proc.stdout[-3000:]  # the README example: its two tests pass
    assert ["FAILED", "test_x.py::test_wrong_expectation"] in [[o, rest.split(" ")[0]] for o, rest in outcomes], (
        proc.stdout[-3000:]
    )
    import torch

    if not torch.cuda.is_available():
        assert "1 skipped" in proc.stdout and "needs a CUDA GPU" in proc.stdout, proc.stdout[-2000:]
    else:
        assert ["PASSED", "test_x.py::test_needs_gpu"] in [[o, rest.split(" ")[0]] for o, rest in outcomes]


def test_fixture_runs_with_overrides_and_writes_a_run_folder(rlharness_run):
    run = rlharness_run(overrides={"pipelines[0].steps": 1, "pipelines[1].steps": 1, "seed": 3}, write=True)
    assert run.reason == "done" and run.violations == [] and run.scenario.seed == 3
    assert run.pipeline("ppl1").steps_done == 1
    assert sorted(os.listdir(run.out_dir)) == [
        "events.jsonl",
        "scenario.yaml",
        "summary.json",
        "summary.txt",
        "trace.json",
        "violations.txt",
    ]
    with pytest.raises(KeyError):
        run.pipeline("nope")


def test_fixture_scenario_errors_are_scenario_errors(rlharness_scenario):
    from simulators.scenario.loader import ScenarioError

    with pytest.raises(ScenarioError, match=r"pipelines\[0\]\.steps: must be > 0"):
        rlharness_scenario(overrides={"pipelines[0].steps": 0})
    path = os.path.join(ROOT, "examples", "scenarios", "tp2_broadcast.yaml")
    s = rlharness_scenario(path, overrides={"horizon_s": 99})
    assert s.horizon_s == 99


def test_apply_overrides_paths():
    data = {"a": [{"b": 1}], "c": {}}
    apply_overrides(data, {"a[0].b": 2, "c.d.e": 3, "f": 4})
    assert data == {"a": [{"b": 2}], "c": {"d": {"e": 3}}, "f": 4}
    for bad in ("a[5].b", "", "a[0].b.c", "a[0]b"):
        with pytest.raises(ValueError):
            apply_overrides({"a": [{"b": 1}]}, {bad: 1})
