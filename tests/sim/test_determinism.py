"""The determinism self-check (``rlharness simulate --check-determinism``): a fresh process
under another PYTHONHASHSEED, the first divergent line, and the failure paths."""

from __future__ import annotations

import pytest

from rlharness.cli import main
from simulators.selfcheck.determinism import Divergence, check_determinism, first_divergence, other_hash_seed
from simulators.runtime.simulation import Simulation
from simulators.scenario.spec import default_scenario


def test_first_divergence_names_the_first_differing_line():
    assert first_divergence(["a", "b", "c"], iter(["a", "b", "c"])) is None
    assert first_divergence(["a", "b", "c"], ["a", "x", "c"]) == Divergence(2, "b", "x")
    assert first_divergence(["a", "b"], ["a", "b", "c"]) == Divergence(3, None, "c")
    assert first_divergence(["a", "b", "c"], ["a"]) == Divergence(2, "b", None)


def test_the_fresh_process_hashes_with_another_seed():
    assert other_hash_seed("5") == "6"
    assert other_hash_seed("4294967295") == "0"
    assert other_hash_seed(None) == "0" and other_hash_seed("random") == "0"


def test_default_scenario_is_byte_identical_in_a_fresh_process(tmp_path, capsys):
    rc = main(["simulate", "--check-determinism", "--quiet", "--no-png", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "determinism: 1953 records byte-identical in a fresh process (PYTHONHASHSEED=" in out


def test_a_model_that_differs_in_the_fresh_process_is_reported_at_its_first_divergent_line(
    tmp_path, capsys, fresh_process_decodes_one_more_token
):
    fresh_process_decodes_one_more_token()
    rc = main(["simulate", "--check-determinism", "--quiet", "--no-png", "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert rc == 1, out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("determinism: DIVERGED"))
    ours, theirs = lines[head + 1], lines[head + 2]
    assert ours.startswith("  this run:  ") and theirs.startswith("  fresh run: ")
    assert '"kind":"request_' in ours and ours[13:] != theirs[13:]
    with open(tmp_path / "run" / "events.jsonl") as fh:
        logged = fh.read().splitlines()
    line = int(lines[head].split("events.jsonl line ")[1].rstrip(":"))
    assert logged[line - 1] == ours[13:]  # the line number points into this run's events.jsonl


def test_a_fresh_run_that_fails_is_an_error_not_a_pass(tmp_path):
    res = Simulation(default_scenario()).run()
    with pytest.raises(RuntimeError, match="the fresh run failed: .*"):
        check_determinism(res, str(tmp_path / "missing.yaml"))
