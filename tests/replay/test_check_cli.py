"""rlharness check: the whole oracle on any event log, its table and its exit codes."""

from __future__ import annotations

import json
import os

import pytest

from harness.logs.check import check_file, run_check
from rlharness.cli import main
from harness.logs.invariants.base import CHECKS, READS, Violation

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRACES = os.path.join(ROOT, "examples", "traces")
SCENARIOS = os.path.join(ROOT, "examples", "scenarios")


def fixed_roll_trace(tmp_path):
    lines = open(os.path.join(TRACES, "roll_dual_4gpu.jsonl")).read().splitlines()
    head = json.loads(lines[0])
    head["scheduler"] = {"ack_unplanned_releases": False}
    path = tmp_path / "roll_fixed.jsonl"
    path.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    return str(path)


def test_roll_trace_fails_planned_release_ack_at_cycle_23(capsys):
    assert main(["check", os.path.join(TRACES, "roll_dual_4gpu.jsonl"), "--upstream-as-findings"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip().startswith("planned_release_ack"))
    assert row.split()[1] == "FAIL"
    assert "acked in cycle 23 while it still holds dp ranks [0, 1]" in out
    assert "decisions derived by replaying" in out and "3 violation(s) of planned_release_ack" in out
    assert "> " in out  # the violating record is marked among its neighbours


def test_roll_trace_passes_with_exact_planned_releases(tmp_path, capsys):
    assert main(["check", fixed_roll_trace(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "every check holds" in out
    statuses = {
        line.split()[0]: line.split()[1]
        for line in out.splitlines()[3:]
        if line.startswith("  ") and len(line.split()) == 4
    }
    assert statuses["planned_release_ack"] == "pass" and statuses["routing"] == "n/a"  # a trace has no requests


def test_simulator_log_is_checked_as_recorded_and_replay_checks_the_whole_log(tmp_path, capsys):
    from simulators.run import simulate
    from simulators.scenario.loader import load_scenario

    # its findings (data_plane, handover) come from records replay does not replay: the
    # whole log is read, not only the decisions
    out = simulate(
        load_scenario(os.path.join(SCENARIOS, "dataplane_via_driver.yaml")), str(tmp_path / "run"), png=False
    )
    log = str(tmp_path / "run" / "events.jsonl")
    oracle, rows = check_file(log)
    assert oracle.how == "as recorded"
    found = sum(len(r.violations) for r in rows)
    assert found == len(out.violations) > 0
    capsys.readouterr()
    assert main(["check", log, "--max-shown", "0"]) == 1
    assert f"{found} violation(s)" in capsys.readouterr().out
    # replay reads the same whole log (not only the decisions it replays) and exits 1 as well
    assert main(["replay", log, "--quiet"]) == 1
    assert f"invariants: {found} violation(s)" in capsys.readouterr().out


def test_a_newly_registered_check_shows_up_in_the_table(monkeypatch, capsys):
    def always(records):
        return [Violation("zz_probe", records[-1]["seq"], "probe fired")]

    monkeypatch.setitem(CHECKS, "zz_probe", always)
    monkeypatch.setitem(READS, "zz_probe", frozenset({"cycle"}))
    assert run_check([os.path.join(TRACES, "partial_overlap_2gpu.jsonl")]) == 1
    out = capsys.readouterr().out
    assert any(line.split()[:2] == ["zz_probe", "FAIL"] for line in out.splitlines())
    assert "probe fired" in out


def test_only_named_checks_run(capsys):
    assert main(["check", os.path.join(TRACES, "roll_dual_4gpu.jsonl"), "--check", "gpu_ownership"]) == 0
    out = capsys.readouterr().out
    assert "gpu_ownership" in out and "planned_release_ack" not in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["check", "/no/such/log.jsonl"], "cannot read"),
        (["check", os.path.join(TRACES, "roll_dual_4gpu.jsonl"), "--check", "nope"], "unknown check"),
        (["check"], "required"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err
    assert "Traceback" not in captured.err


def test_a_bad_second_log_prints_no_report(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"seq":0,"t":0,"kind":"header"}\n')
    assert main(["check", os.path.join(TRACES, "partial_overlap_2gpu.jsonl"), str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "bad.jsonl:1" in captured.err
