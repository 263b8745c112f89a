"""RLix's timeouts in the simulator: a wait past its limit is a `timeout` record and a
fail-fast end of the run at exactly start + limit; within its limit nothing changes."""

from __future__ import annotations

import dataclasses
import os

import pytest
import yaml

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import ScenarioError, load_scenario, scenario_from_mapping
from simulators.scenario.spec import ClusterSpec

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def scenario(name):
    return load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))


def with_costs(s, **costs):
    return dataclasses.replace(s, costs=dataclasses.replace(s.costs, **costs))


def the_timeout(res):
    timeouts = [r for r in res.records if r["kind"] == "timeout"]
    assert len(timeouts) == 1, timeouts
    return timeouts[0]


def effect_spans(records, effect):
    """(start, end or None) of every ``effect`` run, in order."""
    spans, open_ = [], {}
    for r in records:
        if r["kind"] in ("effect_start", "effect_end") and r["effect"] == effect:
            key = (r["pipeline_id"], r.get("scope"), r.get("cycle"), r.get("step"))
            if r["kind"] == "effect_start":
                open_[key] = len(spans)
                spans.append((r["t"], None))
            else:
                i = open_.pop(key)
                spans[i] = (spans[i][0], r["t"])
    return spans


def test_a_refit_over_a_slow_interconnect_outlives_the_selective_sync_timeout():
    res = Simulation(scenario("refit_over_slow_interconnect")).run()
    assert res.reason == "failed" and "selective_sync timed out after 150 s" in res.detail, res.detail
    t = the_timeout(res)
    assert (t["what"], t["pipeline_id"], t["limit_s"]) == ("selective_sync", "ppl1", 150.0)
    assert t["t"] == pytest.approx(t["since"] + 150.0)
    start, end = effect_spans(res.records, "SyncFromCache")[-1]
    assert start == t["since"] and end is None  # the sync it cut short
    assert res.records[-1]["kind"] == "sim_end" and res.records[-2] is t  # the shutdown is immediate
    s = scenario("refit_over_slow_interconnect")
    fast = dataclasses.replace(
        s, cluster=dataclasses.replace(s.cluster, inter_node_bytes_per_s=ClusterSpec(1, 1).inter_node_bytes_per_s)
    )
    done = Simulation(fast).run()
    # handover: NeMo's init keeps the trainer's groups (docs/residency.md), not a timeout matter
    assert done.reason == "done" and [v for v in check_log(done.records) if v.invariant != "handover"] == []
    assert max(end - start for start, end in effect_spans(done.records, "SyncFromCache")) < 150.0


def test_a_planned_release_past_its_limit_shuts_the_run_down():
    s = scenario("roll_dual_4gpu")
    waits = [end - start for start, end in effect_spans(Simulation(s).run().records, "AwaitRelease")]
    longest = max(waits)
    assert longest > 1.0
    res = Simulation(with_costs(s, await_release_timeout_s=1.0)).run()
    t = the_timeout(res)
    assert res.reason == "failed" and t["what"] == "await_release" and t["t"] == pytest.approx(t["since"] + 1.0)
    # a limit above the longest wait changes nothing: same log but for the run's event count
    # and the header, which records the changed deadlines (the liveness monitors' bound)
    base = Simulation(s).run()
    roomy = Simulation(with_costs(s, await_release_timeout_s=longest + 0.01)).run()
    assert roomy.reason == "done" and [r for r in roomy.records if r["kind"] not in ("sim_end", "header")] == [
        r for r in base.records if r["kind"] not in ("sim_end", "header")
    ]
    assert roomy.records[0]["meta"]["timeouts"]["await_release_s"] == longest + 0.01
    assert "timeouts" not in base.records[0]["meta"]


def test_a_coordinator_lock_held_past_its_limit_shuts_the_run_down():
    s = scenario("mixed_64gpu")
    res = Simulation(with_costs(s, resize_lock_timeout_s=0.05)).run()
    t = the_timeout(res)
    assert res.reason == "failed" and t["what"] == "resize_sync_lock", res.detail
    assert t["t"] == pytest.approx(t["since"] + 0.05)
    lock = [(a, b) for a, b in effect_spans(res.records, "LockCoordinator") if a == t["since"] and b is None]
    assert lock, "the acquire that timed out is still open when the run ends"


def test_aborted_requests_that_never_leave_the_engine_time_the_shrink_drain_out():
    res = Simulation(scenario("abort_never_wakes")).run()
    assert res.reason == "failed" and "ppl1: shrink_drain timed out after 30 s" in res.detail, res.detail
    t = the_timeout(res)
    fired = next(r for r in res.records if r["kind"] == "fault_fired")
    assert (fired["name"], fired["step"]) == ("abort_never_wakes", 1) and fired["t"] == t["since"]
    assert t["t"] == pytest.approx(t["since"] + 30.0)
    # the shrink that hung had aborted requests in flight, and its drain never ended
    aborts = [
        r for r in res.records if r["kind"] == "request_abort" and r["pipeline_id"] == "ppl1" and r["t"] == t["since"]
    ]
    assert aborts
    assert [(a, b) for a, b in effect_spans(res.records, "Drain") if a == t["since"]] == [(t["since"], None)]
    clean = Simulation(dataclasses.replace(res.scenario, faults=())).run()
    assert clean.reason == "done" and check_log(clean.records) == []


def test_a_drain_slower_than_its_limit_times_out_without_any_fault():
    res = Simulation(with_costs(scenario("roll_dual_4gpu"), drain_s=5.0, shrink_drain_timeout_s=4.0)).run()
    t = the_timeout(res)
    assert res.reason == "failed" and t["what"] == "shrink_drain" and t["t"] == pytest.approx(t["since"] + 4.0)
    in_time = Simulation(with_costs(scenario("roll_dual_4gpu"), drain_s=4.0, shrink_drain_timeout_s=4.0)).run()
    assert in_time.reason == "done"  # a drain that ends at the very instant of its limit is in time


def test_timeout_limits_must_be_positive():
    data = yaml.safe_load(open(os.path.join(ROOT, "examples", "scenarios", "default.yaml")))
    data["costs"] = {"selective_sync_timeout_s": 0}
    with pytest.raises(ScenarioError) as info:
        scenario_from_mapping(data, "x.yaml")
    assert str(info.value).startswith("x.yaml: costs.selective_sync_timeout_s: ")
