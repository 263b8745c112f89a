"""Replay's verdicts a script can act on: a decision divergence (exit DIVERGED) is not an
invariant violation in a replay whose decisions agree (exit 1), and ``--verdict`` says
which as JSON; a commit after the model failed fast is a divergence, not bad input; an
input is refused for the reason RLix checks first."""

from __future__ import annotations

import json
import os

from harness.exit_codes import ExitCode
from rlharness.cli import main

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ROLL = os.path.join(ROOT, "examples", "traces", "roll_dual_4gpu.jsonl")  # RLix's premature ack: a violation
CLEAN = os.path.join(ROOT, "examples", "traces", "partial_overlap_2gpu.jsonl")


def rec(seq, kind, **fields):
    return {"seq": seq, "t": float(seq), "kind": kind, **fields}


def write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def header(**scheduler):
    return {
        "seq": 0,
        "t": 0,
        "kind": "header",
        "schema": "rlharness.eventlog",
        "version": 1,
        "cluster": {"nodes": 1, "gpus_per_node": 4},
        "scheduler": scheduler,
    }


def verdict(path) -> dict:
    return json.loads(path.read_text())


def _tamper_first_grant(path) -> None:
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        d = json.loads(line)
        if d["kind"] == "signalled" and d.get("gpus"):
            d["gpus"] = [d["gpus"][0] + 100]
            lines[i] = json.dumps(d)
            break
    path.write_text("\n".join(lines) + "\n")


def test_a_violation_with_identical_decisions_is_exit_1(tmp_path):
    own, v = tmp_path / "own.jsonl", tmp_path / "v.json"
    main(["replay", ROLL, "--out", str(own), "--quiet"])
    assert main(["replay", ROLL, "--expect", str(own), "--quiet", "--verdict", str(v), "--upstream-as-findings"]) == 1
    got = verdict(v)
    assert (got["verdict"], got["exit"], got["decisions"], got["divergence"]) == ("violation", 1, "identical", None)
    assert got["invariants"]["violations"] > 0
    assert {u["check"] for u in got["invariants"]["unexpected"]} == {"planned_release_ack"}


def test_a_decision_divergence_is_exit_3_with_or_without_violations(tmp_path):
    for trace in (CLEAN, ROLL):
        own, v = tmp_path / "own.jsonl", tmp_path / "v.json"
        main(["replay", trace, "--out", str(own), "--quiet"])
        _tamper_first_grant(own)
        assert main(["replay", trace, "--expect", str(own), "--quiet", "--verdict", str(v)]) == ExitCode.DIVERGED, trace
        got = verdict(v)
        assert (got["verdict"], got["decisions"]) == ("diverged", "diverged")
        assert got["divergence"]["recorded"]["gpus"][0] >= 100 and got["divergence"]["model"]["gpus"][0] < 100
    # a clean trace replayed against its own log: exit 0, verdict ok
    own, v = tmp_path / "c.jsonl", tmp_path / "c.json"
    main(["replay", CLEAN, "--out", str(own), "--quiet"])
    assert main(["replay", CLEAN, "--expect", str(own), "--quiet", "--verdict", str(v)]) == 0
    assert (verdict(v)["verdict"], verdict(v)["decisions"]) == ("ok", "identical")
    assert main(["replay", CLEAN, "--quiet", "--verdict", str(v)]) == 0
    assert verdict(v)["decisions"] == "not_compared"


def _gen_request_trace(tmp_path, name, **scheduler):
    return write(
        tmp_path / name,
        [
            header(**scheduler),
            rec(
                1,
                "register",
                pipeline_id="p1",
                cluster_tp_configs={"actor_train": 1, "actor_infer": 1},
                cluster_device_mappings={"actor_train": [0], "actor_infer": [0, 1, 2, 3]},
            ),
            rec(2, "admit", pipeline_id="p1"),
            rec(3, "request", cluster_id="p1_actor_infer", priority="GENERATION", step_target_estimate=8),
            rec(4, "cycle", phase="plan"),
            rec(5, "cycle", phase="commit"),
        ],
    )


def test_a_commit_after_fail_fast_is_a_divergence_not_bad_input(tmp_path, capsys):
    # one activation allowed: the gap-ratio planner needs more, the model fails fast
    # while planning, and the runtime's log commits that cycle anyway
    failing = _gen_request_trace(tmp_path, "fail.jsonl", max_gap_activations=1)
    out = tmp_path / "d.jsonl"
    assert main(["replay", failing, "--out", str(out), "--quiet"]) == 0  # not 2
    decisions = [json.loads(x) for x in out.read_text().splitlines()]
    assert [d["kind"] for d in decisions][-2:] == ["signalled", "rejected"]
    assert "commit after the scheduler failed fast" in decisions[-1]["reason"]
    assert any(d["kind"] == "scheduler_failed" for d in decisions)
    # what a runtime that did not fail recorded: the same inputs, the cycle committed
    recorded = tmp_path / "recorded.jsonl"
    main(["replay", _gen_request_trace(tmp_path, "ok.jsonl"), "--out", str(recorded), "--quiet"])
    v = tmp_path / "v.json"
    capsys.readouterr()
    assert main(["replay", failing, "--expect", str(recorded), "--quiet", "--verdict", str(v)]) == ExitCode.DIVERGED
    assert verdict(v)["divergence"]["model"]["kind"] == "scheduler_failed"
    assert "error:" not in capsys.readouterr().err


def _progress_reasons(tmp_path, reports):
    path = write(
        tmp_path / "p.jsonl",
        [header()]
        + [
            rec(i + 1, "progress", pipeline_id=pid, step_target=target, completed=0)
            for i, (pid, target) in enumerate(reports)
        ],
    )
    out = tmp_path / "pd.jsonl"
    assert main(["replay", path, "--out", str(out), "--quiet"]) == 0
    return [json.loads(x)["reason"] for x in out.read_text().splitlines() if json.loads(x)["kind"] == "rejected"]


def test_a_progress_report_is_refused_in_rlix_check_order(tmp_path):
    # RLix (rlix/scheduler/scheduler.py report_progress): the id's form, then the target
    # outside the lock, then the registry under it
    reasons = _progress_reasons(tmp_path, [("ghost", 0), ("ghost", 4), ("bad id!", 0)])
    assert reasons[0].startswith("step_target_trajectories must be > 0")
    assert reasons[1] == "pipeline_id 'ghost' not registered"
    assert "step_target" not in reasons[2] and "not registered" not in reasons[2]


def test_clear_progress_checks_only_the_id_form_as_rlix_does(tmp_path):
    path = write(
        tmp_path / "c.jsonl",
        [header(), rec(1, "clear_progress", pipeline_id="ghost"), rec(2, "clear_progress", pipeline_id="bad id!")],
    )
    out = tmp_path / "cd.jsonl"
    assert main(["replay", path, "--out", str(out), "--quiet"]) == 0
    rejected = [json.loads(x) for x in out.read_text().splitlines() if json.loads(x)["kind"] == "rejected"]
    assert [r["input_seq"] for r in rejected] == [2]  # an unregistered pipeline's clear is a no-op
