"""rlharness replay: determinism, --expect, rejected inputs and the bad-input contract."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from harness.exit_codes import ExitCode
from rlharness.cli import main

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "traces", "*.jsonl")))
HEADER = {
    "seq": 0,
    "t": 0,
    "kind": "header",
    "schema": "rlharness.eventlog",
    "version": 1,
    "cluster": {"nodes": 1, "gpus_per_node": 2},
}


def write_trace(path, records):
    with open(path, "w") as fh:
        for r in records:
            fh.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def rec(seq, kind, t=0.0, **fields):
    return {"seq": seq, "t": t, "kind": kind, **fields}


def two_gpu_register(seq0=1):
    return [
        rec(
            seq0,
            "register",
            pipeline_id="p1",
            cluster_tp_configs={"actor_train": 1, "actor_infer": 1},
            cluster_device_mappings={"actor_train": [0], "actor_infer": [0, 1]},
        ),
        rec(seq0 + 1, "admit", pipeline_id="p1"),
    ]


# traces whose replay finds a violation: RLix's premature planned-release ack, known
# upstream behaviour (harness/logs/known_upstream.py), so the replay exits 0 and reports it
WITH_FINDINGS = {"gap_ratio_3pipelines.jsonl", "roll_dual_4gpu.jsonl"}


def exit_code(trace):
    return 0


def test_examples_ship_three_traces():
    names = {os.path.basename(p) for p in EXAMPLES}
    assert {"partial_overlap_2gpu.jsonl", "roll_dual_4gpu.jsonl", "gap_ratio_3pipelines.jsonl"} <= names


@pytest.mark.parametrize("trace", EXAMPLES, ids=os.path.basename)
def test_replay_twice_gives_byte_identical_decision_logs(trace, tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["replay", trace, "--out", str(a), "--quiet"]) == exit_code(trace)
    assert main(["replay", trace, "--out", str(b), "--quiet"]) == exit_code(trace)
    counted = main(["replay", trace, "--quiet", "--upstream-as-findings"])
    assert counted == (1 if os.path.basename(trace) in WITH_FINDINGS else 0)
    assert a.read_bytes() == b.read_bytes()
    kinds = [json.loads(line)["kind"] for line in a.read_text().splitlines()]
    assert kinds[0] == "header" and "plan" in kinds and "commit" in kinds


@pytest.mark.parametrize("trace", EXAMPLES, ids=os.path.basename)
def test_replay_matches_its_own_decision_log(trace, tmp_path, capsys):
    out = tmp_path / "d.jsonl"
    assert main(["replay", trace, "--out", str(out), "--quiet"]) == exit_code(trace)
    assert main(["replay", trace, "--expect", str(out), "--quiet"]) == exit_code(trace)
    assert "decisions identical" in capsys.readouterr().out


def test_expect_reports_first_divergence_with_both_sides(tmp_path, capsys):
    trace = EXAMPLES[0]
    out = tmp_path / "d.jsonl"
    main(["replay", trace, "--out", str(out), "--quiet"])
    lines = out.read_text().splitlines()
    # tamper with the first plan: claim a different grant
    for i, line in enumerate(lines):
        d = json.loads(line)
        if d["kind"] == "signalled":
            d["gpus"] = [99]
            lines[i] = json.dumps(d)
            tampered_line = i + 1
            break
    out.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert (
        main(["replay", trace, "--expect", str(out), "--quiet"]) == ExitCode.DIVERGED
    )  # a divergence, not a violation
    text = capsys.readouterr().out
    assert f"expected file line {tampered_line}" in text
    assert "model:" in text and "recorded:" in text and "[99]" in text


def test_expect_detects_missing_decisions(tmp_path, capsys):
    trace = EXAMPLES[0]
    out = tmp_path / "d.jsonl"
    main(["replay", trace, "--out", str(out), "--quiet"])
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:-3]) + "\n")
    assert main(["replay", trace, "--expect", str(out), "--quiet"]) == ExitCode.DIVERGED
    assert "<no more decisions>" in capsys.readouterr().out


def test_rejected_inputs_become_records_and_replay_goes_on(tmp_path, capsys):
    path = write_trace(
        tmp_path / "t.jsonl",
        [
            HEADER,
            *two_gpu_register(),
            rec(3, "release", cluster_id="p1_actor_train"),  # nothing allocated
            rec(4, "request", cluster_id="ghost_actor_infer", priority="GENERATION"),  # unregistered
            rec(
                5,
                "register",
                pipeline_id="p2",
                cluster_tp_configs={"actor_infer": 2},
                cluster_device_mappings={"actor_infer": [0, 2]},
            ),  # out of range
            rec(6, "request", cluster_id="p1_actor_infer", priority="GENERATION", step_target_estimate=4),
            rec(7, "request", cluster_id="p1_actor_infer", priority="GENERATION", step_target_estimate=4),  # duplicate
            rec(8, "cycle"),
        ],
    )
    out = tmp_path / "d.jsonl"
    assert main(["replay", path, "--out", str(out), "--quiet"]) == 0
    records = [json.loads(x) for x in out.read_text().splitlines()]
    rejected = [r for r in records if r["kind"] == "rejected"]
    assert [r["input_seq"] for r in rejected] == [3, 4, 5, 7]
    assert "not found in active_allocations" in rejected[0]["reason"]
    assert "not registered" in rejected[1]["reason"]
    assert "pipeline p2, cluster actor_infer" in rejected[2]["reason"] and "gpu_range" in rejected[2]["reason"]
    assert "Duplicate pending request" in rejected[3]["reason"]
    grants = [r for r in records if r["kind"] == "signalled"]
    assert grants and grants[-1]["gpus"] == [0, 1]  # the cycle after the rejections still ran


def test_non_contiguous_tp_group_is_rejected_not_fatal(tmp_path):
    path = write_trace(
        tmp_path / "t.jsonl",
        [
            {**HEADER, "cluster": {"nodes": 1, "gpus_per_node": 4}},
            rec(
                1,
                "register",
                pipeline_id="p",
                cluster_tp_configs={"actor_infer": 2},
                cluster_device_mappings={"actor_infer": [0, 2]},
            ),
            rec(2, "cycle"),
        ],
    )
    out = tmp_path / "d.jsonl"
    assert main(["replay", path, "--out", str(out), "--quiet"]) == 0
    reasons = [json.loads(x).get("reason", "") for x in out.read_text().splitlines()]
    assert any("tp_contiguous" in r for r in reasons)


def test_lock_gap_unregister_leaves_gpus_idle_and_skips_stale_ops(tmp_path):
    path = write_trace(
        tmp_path / "t.jsonl",
        [
            HEADER,
            *two_gpu_register(),
            rec(3, "request", cluster_id="p1_actor_infer", priority="GENERATION", step_target_estimate=2),
            rec(4, "cycle", phase="plan"),
            rec(5, "unregister", pipeline_id="p1"),
            rec(6, "cycle", phase="commit"),
        ],
    )
    out = tmp_path / "d.jsonl"
    assert main(["replay", path, "--out", str(out), "--quiet"]) == 0
    records = [json.loads(x) for x in out.read_text().splitlines()]
    commit = [r for r in records if r["kind"] == "commit"][-1]
    assert commit["idle_gpus"] == 2
    assert commit["skipped_stale"] == ["expand p1_actor_infer"]
    errored = [r for r in records if r["kind"] == "signalled" and r["error"]]
    assert errored and "unregistered" in errored[0]["error"]


BAD_INPUTS = [
    (
        "malformed",
        [
            '{"seq": 0, "t": 0, "kind": "header"',
        ],
        ":1: malformed JSON",
    ),
    ("unknown_kind", [HEADER, rec(1, "teleport", pipeline_id="x")], ":2: field 'kind': unknown record kind 'teleport'"),
    (
        "bad_type",
        [HEADER, rec(1, "request", cluster_id="p1_actor_infer", priority="GEN", step_target_estimate="four")],
        ":2: field 'step_target_estimate': must be an integer or null",
    ),
    ("missing_field", [HEADER, rec(1, "admit")], ":2: field 'pipeline_id': missing"),
    (
        "unknown_field",
        [HEADER, rec(1, "admit", pipeline_id="p", colour="red")],
        ":2: field 'colour': not a field of admit records",
    ),
    (
        "bad_topology",
        [{**HEADER, "cluster": {"nodes": 0, "gpus_per_node": 2}}],
        ":1: field 'cluster.nodes': must be a positive integer",
    ),
    ("no_header", [rec(1, "admit", pipeline_id="p")], ":1: the first record must be a header"),
    (
        "seq_not_increasing",
        [HEADER, rec(2, "admit", pipeline_id="p"), rec(2, "admit", pipeline_id="p")],
        ":3: field 'seq'",
    ),
    (
        "time_goes_back",
        [HEADER, rec(1, "admit", t=5, pipeline_id="p"), rec(2, "admit", t=4, pipeline_id="p")],
        ":3: field 't'",
    ),
    (
        "bad_priority",
        [HEADER, rec(1, "request", cluster_id="p1_actor_infer", priority="URGENT")],
        ":2: field 'priority': unknown priority",
    ),
    ("bad_phase", [HEADER, rec(1, "cycle", phase="later")], ":2: field 'phase'"),
    ("bad_option", [{**HEADER, "scheduler": {"epsilon": "x"}}], ":1: field 'scheduler'"),
]


@pytest.mark.parametrize("name,lines,expected", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_no_output(name, lines, expected, tmp_path, capsys):
    # in this process (the command is main(); a real process's exit code and stderr: below)
    path = write_trace(tmp_path / f"{name}.jsonl", lines)
    out = tmp_path / "out" / "decisions.jsonl"
    assert main(["replay", path, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, captured.err
    assert err[0].startswith(f"error: {path}:") and expected in err[0], err[0]
    assert "Traceback" not in captured.err
    assert captured.out == ""
    assert not out.exists() and not (tmp_path / "out").exists()


def test_a_real_process_ends_a_bad_input_and_a_usage_error_with_one_line_and_exit_2(tmp_path):
    """The contract at the process boundary: exit status 2, one stderr line, no traceback,
    nothing on stdout, nothing written (the other cases run main() in-process above)."""
    name, lines, expected = BAD_INPUTS[0]
    path = write_trace(tmp_path / f"{name}.jsonl", lines)
    out = tmp_path / "out" / "decisions.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "rlharness", "replay", path, "--out", str(out)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}:") and expected in err[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not out.exists() and not (tmp_path / "out").exists()
    proc = subprocess.run([sys.executable, "-m", "rlharness", "frobnicate"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr


def test_cli_usage_errors_are_one_line(tmp_path, capsys):
    for argv in (["replay"], ["frobnicate"], ["replay", str(tmp_path / "missing.jsonl")], []):
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        assert len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("error: "), captured.err
        assert captured.out == "", argv


def test_console_script_is_installed():
    # the script pip installed beside this interpreter (the suite may run as
    # .venv/bin/python -m pytest, with the environment not activated), else the one on PATH
    script = os.path.join(sysconfig.get_path("scripts"), "rlharness")
    script = script if os.path.exists(script) else shutil.which("rlharness")
    assert script, "no rlharness console script beside this interpreter or on PATH: pip install -e ."
    clean = [p for p in EXAMPLES if os.path.basename(p) not in WITH_FINDINGS][0]
    proc = subprocess.run([script, "replay", clean, "--quiet"], capture_output=True, text=True)
    assert proc.returncode == 0 and "cycles committed" in proc.stdout


def test_replay_runs_the_invariant_oracle_and_exits_1_on_a_violation(capsys):
    trace = [p for p in EXAMPLES if p.endswith("gap_ratio_3pipelines.jsonl")][0]
    assert main(["replay", trace, "--quiet", "--upstream-as-findings"]) == 1
    out = capsys.readouterr().out
    assert "invariants: 1 violation(s)" in out and "planned_release_ack" in out
    assert main(["replay", trace, "--quiet"]) == 0  # the same violation is known upstream behaviour: one line
    assert "  known upstream  planned_release_ack x1" in capsys.readouterr().out
    other = [p for p in EXAMPLES if p.endswith("partial_overlap_2gpu.jsonl")][0]
    assert main(["replay", other, "--quiet"]) == 0
    assert "invariants: all hold" in capsys.readouterr().out


def test_a_refused_release_then_request_keeps_its_release_in_the_decision_log(tmp_path, capsys):
    """The release of release_then_request sticks when the request half is refused (a
    duplicate pending request): the ``released`` record must be logged, or the next
    grant of that GPU looks like a double grant to the oracle."""
    trace = write_trace(
        tmp_path / "t.jsonl",
        [HEADER]
        + two_gpu_register()
        + [
            rec(3, "request", cluster_id="p1_actor_train", priority="ACTOR_TRAINING"),
            rec(4, "cycle"),
            rec(5, "request", cluster_id="p1_actor_infer", priority="GENERATION", step_target_estimate=1),
            rec(
                6,
                "release_then_request",
                release_cluster_id="p1_actor_train",
                request_cluster_id="p1_actor_infer",
                request_priority="GENERATION",
            ),
            rec(7, "cycle"),
        ],
    )
    out = tmp_path / "d.jsonl"
    assert main(["replay", trace, "--out", str(out)]) == 0, capsys.readouterr().out
    kinds = [(r["kind"], r.get("cluster_id"), r.get("reason")) for r in map(json.loads, out.read_text().splitlines())]
    i = kinds.index(("released", "p1_actor_train", "release"))
    assert kinds[i + 1][0] == "rejected"
    from harness.logs.invariants import check_log

    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert check_log(records) == []
