"""The decision-walk checks share one replay of the scheduler's decisions: together they
find what each finds walking its own records alone (the walk's own ``run`` over its own
view, the reference), the decisions are applied once per log, and a check replaced in
``CHECKS`` by hand runs as itself, in the batch oracle and the online one."""

from __future__ import annotations

import os

from harness.logs.invariants import CHECKS, SEES, Violation, check_log, kind_views, run_checks
from harness.logs.invariants.allocations import Holdings
from harness.logs.invariants.decision_walks import WALK_CHECKS, run_walks
from harness.logs.invariants.online import OnlineOracle
from tests.unit.test_invariants import ROOT, decisions

ROLL = os.path.join(ROOT, "examples", "traces", "roll_dual_4gpu.jsonl")


def _broken_roll():
    """The ROLL trace (planned_release_ack fires) with a double grant and a commit whose idle
    count is off (gpu_ownership and plan_validation fire too)."""
    recs = decisions(ROLL)
    plan = next(r for r in recs if r["kind"] == "plan" and r["expands"])
    plan["expands"][0]["bundles"].append({"dp_rank": 9, "gpus": [1]})
    commit = next(r for r in recs if r["kind"] == "commit" and r["cycle"] != plan["cycle"])
    commit["idle_gpus"] += 1
    return recs


def _alone(records, name):
    """``name``'s walk run by itself over its own view (what each check did before the walks
    were shared)."""
    view = kind_views(records, [SEES[name]])[SEES[name]]
    keep = WALK_CHECKS[name].keep
    if keep is not None:
        view = [r for r in view if keep(r)]
    walk = WALK_CHECKS[name].make(view)
    walk.run()
    return WALK_CHECKS[name].findings(walk)


def test_the_shared_walk_finds_what_each_walk_finds_alone():
    recs = _broken_roll()
    names = list(WALK_CHECKS)
    assert len(names) >= 8
    alone = {n: _alone(recs, n) for n in names}
    fired = {n for n, found in alone.items() if found}
    assert {"gpu_ownership", "plan_validation", "planned_release_ack"} <= fired
    assert run_checks(recs, names) == alone
    for chunk in (1, 7, 4096):
        oracle = OnlineOracle(names)
        for i in range(0, len(recs), chunk):
            oracle(recs[i : i + chunk])
        assert oracle.finish() == alone


def test_the_decisions_are_applied_once_per_log(monkeypatch):
    recs = decisions(ROLL)
    applied = []
    original = Holdings.apply_plan
    monkeypatch.setattr(Holdings, "apply_plan", lambda self, *a: applied.append(1) or original(self, *a))
    commits = sum(1 for r in recs if r["kind"] == "commit")
    assert commits > 0
    run_checks(recs, list(WALK_CHECKS))
    assert len(applied) == commits
    applied.clear()
    oracle = OnlineOracle(list(WALK_CHECKS))
    oracle(recs)
    oracle.finish()
    assert len(applied) == commits
    applied.clear()
    check_log(recs, ["gpu_ownership"])
    assert len(applied) == commits


def test_a_check_replaced_by_hand_runs_as_itself(monkeypatch):
    recs = decisions(ROLL)
    probe = [Violation("gpu_ownership", 0, "the replacement ran")]
    monkeypatch.setitem(CHECKS, "gpu_ownership", lambda records: list(probe))
    names = ["gpu_ownership", "planned_release_ack"]
    found = run_checks(recs, names)
    assert found["gpu_ownership"] == probe and found["planned_release_ack"]
    oracle = OnlineOracle(names)
    oracle(recs)
    assert oracle.finish()["gpu_ownership"] == probe


def test_an_empty_log_has_no_findings():
    assert run_walks([], list(WALK_CHECKS)) == {n: [] for n in WALK_CHECKS}
