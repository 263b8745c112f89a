"""Expected findings (docs/expected-findings.md): a scenario's ``expect:`` list and the
``--baseline`` file turn known findings into reports, not failures; a new finding is red
and named alone; ``--strict`` is red when an expected finding vanished.

The 16-GPU scenario is the issue's: written from the docs, it finishes with by-design
findings only, so it must be green as shipped.
"""

from __future__ import annotations

import json
import os

import pytest
import yaml

from harness.logs.expect import Expectation, Finding, classify, from_signature, matches
from rlharness.cli import main
from rlharness.pytest_plugin import run

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MIX = os.path.join(ROOT, "examples", "scenarios", "mixed_16gpu_expected.yaml")
ROLL_TRACE = os.path.join(ROOT, "examples", "traces", "roll_dual_4gpu.jsonl")


def _mix(tmp_path, **changes) -> str:
    """The shipped 16-GPU scenario with top-level fields replaced, as a file."""
    with open(MIX, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data.update(changes)
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _findings(out_dir) -> dict:
    with open(os.path.join(out_dir, "summary.json"), encoding="utf-8") as fh:
        return json.load(fh)["findings"]


def test_the_16gpu_scenario_is_green_with_its_expected_findings(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", MIX, "--out", str(out), "--no-png", "--quiet"]) == 0
    text = capsys.readouterr().out
    f = _findings(out)
    assert f["unexpected"] == [] and f["expected_not_found"] == []
    # the by-design findings occurred and are shown apart, each with its reason
    assert {e["check"] for e in f["expected"]} == {"handover", "planned_release_ack", "stale_serving"}
    assert all(e["count"] > 0 and e["reason"] for e in f["expected"])
    assert "0 unexpected" in text and "expected    handover pipeline=big7b" in text
    # without its expect: list it is still green: each of these is known upstream behaviour
    # (harness/logs/known_upstream.py), one line each; counted as findings, the same run is red
    capsys.readouterr()
    bare = _mix(tmp_path, expect=[])
    assert main(["simulate", bare, "--out", str(tmp_path / "bare"), "--no-png", "--quiet"]) == 0
    text = capsys.readouterr().out
    known = [line for line in text.splitlines() if line.startswith("  known upstream  ")]
    assert [line.split()[2] for line in known] == ["handover", "planned_release_ack", "stale_serving"], known
    assert all("rlops/rlix f77d913" in line for line in known)
    assert (
        main(["simulate", bare, "--out", str(tmp_path / "bare2"), "--no-png", "--quiet", "--upstream-as-findings"]) == 1
    )
    assert {u["check"] for u in _findings(tmp_path / "bare2")["unexpected"]} == {
        "handover",
        "planned_release_ack",
        "stale_serving",
    }


def test_one_fault_added_is_red_and_names_only_the_new_finding(tmp_path, capsys):
    scenario = _mix(tmp_path, faults=[{"name": "strand_sync_group", "pipeline": "big7b", "at_step": 1}])
    out = tmp_path / "run"
    assert main(["simulate", scenario, "--out", str(out), "--no-png", "--quiet"]) == 1
    f = _findings(out)
    # the stranded groups (sync_groups), and their number growing sync after sync (cycle_trends)
    assert {u["check"] for u in f["unexpected"]} == {"sync_groups", "cycle_trends"}
    assert f["expected_not_found"] == []  # the known ones still occur and stay expected
    text = capsys.readouterr().out
    assert "UNEXPECTED  [sync_groups]" in text and "UNEXPECTED  [handover]" not in text


def test_strict_is_red_when_an_expected_finding_disappears(tmp_path, capsys):
    # RLix's exact planned releases remove the premature ack and the stale serving it causes
    scenario = _mix(tmp_path, scheduler={"ack_unplanned_releases": False})
    assert main(["simulate", scenario, "--out", str(tmp_path / "a"), "--no-png", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "not found   planned_release_ack pipeline=roll15" in text
    assert main(["simulate", scenario, "--out", str(tmp_path / "b"), "--no-png", "--quiet", "--strict"]) == 1
    assert {e["check"] for e in _findings(tmp_path / "b")["expected_not_found"]} == {
        "planned_release_ack",
        "stale_serving",
    }
    # the shipped scenario stays green under --strict: every expectation is met
    assert main(["simulate", MIX, "--out", str(tmp_path / "c"), "--no-png", "--quiet", "--strict"]) == 0


@pytest.mark.parametrize(
    "expect, where",
    [
        ([{"check": "handover"}], "expect[0].reason: missing"),
        ([{"check": "handover", "reason": "  "}], "expect[0].reason: expected a non-empty string"),
        ([{"check": "handovr", "reason": "typo"}], "expect[0].check: unknown check 'handovr'"),
        (
            [{"check": "handover", "pipeline": "big8b", "reason": "x"}],
            "expect[0].pipeline: no pipeline or pipeline type 'big8b'",
        ),
        (
            [{"check": "*", "after_fault": "no_such_fault", "reason": "x"}],
            "expect[0].after_fault: no fault 'no_such_fault'",
        ),
        ([{"check": "handover", "reason": "x", "gpu": 3}], "expect[0].gpu: unknown field"),
        ({"check": "handover"}, "expect: expected a list"),
    ],
)
def test_a_bad_expect_entry_is_one_line_naming_the_field(tmp_path, capsys, expect, where):
    out = tmp_path / "run"
    assert main(["simulate", _mix(tmp_path, expect=expect), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and where in err and "Traceback" not in err
    assert not out.exists()


def test_check_writes_a_baseline_that_makes_it_green_and_strict_catches_a_stale_one(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert (
        main(
            [
                "simulate",
                _mix(tmp_path, expect=[]),
                "--out",
                str(run_dir),
                "--no-png",
                "--quiet",
                "--upstream-as-findings",
            ]
        )
        == 1
    )
    log = str(run_dir / "events.jsonl")
    assert main(["check", log]) == 0  # known upstream behaviour only
    assert main(["check", log, "--upstream-as-findings"]) == 1
    base = tmp_path / "baseline.yaml"
    assert main(["check", log, "--write-baseline", str(base)]) == 0
    entries = yaml.safe_load(base.read_text())["expect"]
    assert {e["check"] for e in entries} == {"handover", "planned_release_ack", "stale_serving"}
    assert all(e["reason"] for e in entries)
    assert main(["check", log, "--baseline", str(base), "--strict", "--upstream-as-findings"]) == 0
    # a baseline entry for a finding this log does not have: reported; red only under --strict
    base.write_text(base.read_text() + "- {check: vram, reason: an OOM we used to see}\n")
    capsys.readouterr()
    assert main(["check", log, "--baseline", str(base)]) == 0
    assert "not found   vram" in capsys.readouterr().out
    assert main(["check", log, "--baseline", str(base), "--strict"]) == 1


def test_replay_and_simulate_read_the_same_baseline_file(tmp_path, capsys):
    base = tmp_path / "b.yaml"
    base.write_text('expect:\n  - {check: planned_release_ack, reason: "RLix\'s premature ack, by design"}\n')
    assert main(["replay", ROLL_TRACE, "--quiet", "--upstream-as-findings"]) == 1
    assert main(["replay", ROLL_TRACE, "--quiet", "--upstream-as-findings", "--baseline", str(base)]) == 0
    assert main(["replay", ROLL_TRACE, "--quiet"]) == 0  # RLix's premature ack is known upstream behaviour
    assert (
        main(
            [
                "simulate",
                os.path.join(ROOT, "examples", "scenarios", "roll_dual_4gpu.yaml"),
                "--out",
                str(tmp_path / "r"),
                "--no-png",
                "--quiet",
                "--baseline",
                str(base),
            ]
        )
        == 0
    )


@pytest.mark.parametrize(
    "text, where",
    [
        ("expect: [{check: handover}]\n", "expect[0].reason: missing"),
        ("- {check: handover, reason: x}\n", "(top level): expected a mapping with an 'expect' list"),
        ("expect: []\nextra: 1\n", "extra: unknown field"),
        ("expect: [\n", "malformed YAML"),
    ],
)
def test_a_bad_baseline_file_is_one_line_and_exit_2_before_any_work(tmp_path, capsys, text, where):
    base = tmp_path / "b.yaml"
    base.write_text(text)
    for argv in (
        ["simulate", MIX, "--out", str(tmp_path / "o"), "--quiet"],
        ["check", ROLL_TRACE],
        ["replay", ROLL_TRACE],
        ["fuzz", "--seeds", "1", "--out", str(tmp_path / "f")],
    ):
        assert main(argv + ["--baseline", str(base)]) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and where in err and str(base) in err, (argv, err)
    assert not (tmp_path / "o").exists() and not (tmp_path / "f" / "results.json").exists()


def test_the_pytest_plugin_exposes_unexpected_and_takes_a_baseline():
    bare = {"expect": []}
    assert run(MIX, overrides=bare).unexpected == []  # known upstream behaviour only
    res = run(MIX, overrides=bare, upstream_as_findings=True)
    assert {f.check for f in res.unexpected} == {"handover", "planned_release_ack", "stale_serving"}
    res = run(
        MIX,
        overrides=bare,
        upstream_as_findings=True,
        baseline=[
            {"check": "handover", "pipeline": "nemo_async", "reason": "init groups"},
            {"check": "planned_release_ack", "reason": "RLix hazard"},
            {"check": "oom:*", "reason": "never happens here"},
        ],
    )
    assert {f.check for f in res.unexpected} == {"stale_serving"}
    assert {f.check for f in res.expected} == {"handover", "planned_release_ack"}
    assert [e.check for e in res.expected_not_found] == ["oom:*"]
    assert run(MIX).unexpected == []


def test_matching_reads_signatures_and_scopes_by_pipeline_cluster_and_fault():
    # written out by hand, independent of the parser: head, roles, faults
    f = from_signature("oom:kv_cache[nemo_async,roll_sync] +wake_before_offload +lost_finish")
    assert (f.check, f.pipelines, f.faults) == (
        "oom:kv_cache",
        ("nemo_async", "roll_sync"),
        ("wake_before_offload", "lost_finish"),
    )
    assert from_signature("planned_release_ack").pipelines == ()
    hit = Finding("handover", "GPU 0 granted to a_actor_infer ...", 7, ("a", "nemo_async"), ("a_actor_infer",))
    assert matches(Expectation("hand*", "r"), hit)
    assert matches(Expectation("handover", "r", pipeline="nemo_*", cluster="a_actor_infer"), hit)
    assert not matches(Expectation("handover", "r", pipeline="b"), hit)
    assert not matches(Expectation("handover", "r", cluster="a_actor_train"), hit)
    assert not matches(Expectation("*", "r", after_fault="lost_finish"), hit)
    assert matches(Expectation("*", "r", after_fault="lost_*"), f)
    # "[" is literal, not a character class
    assert matches(Expectation("failed:x [..]", "r"), Finding("failed:x [..]"))
    v = classify([hit, Finding("vram")], [Expectation("handover", "r"), Expectation("liveness", "r")])
    assert [x.check for x in v.unexpected] == ["vram"] and [e.check for e in v.not_found] == ["liveness"]
    assert v.failed() and v.failed(strict=True)
    assert not classify([hit], [Expectation("handover", "r"), Expectation("liveness", "r")]).failed()
    assert classify([hit], [Expectation("handover", "r"), Expectation("liveness", "r")]).failed(strict=True)
