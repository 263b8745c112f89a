"""The wait-for graph (deadlock, lost_wakeup) and the liveness monitors (hot_state,
livelock): each fires on a crafted log and on a real run, and the field-report scenarios'
fixed variants stay clean under a few exploration seeds of each strategy."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.logs.invariants import check_log
from simulators.runtime.explore import ExploreSpec
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario
from simulators.scenario.spec import FaultSpec

ROOT = Path(__file__).resolve().parents[2]
NEW = ("deadlock", "lost_wakeup", "hot_state", "livelock")


def _log(*recs, meta=None):
    out = [
        {
            "seq": 0,
            "t": 0.0,
            "kind": "header",
            "schema": "rlharness.eventlog",
            "version": 1,
            "cluster": {"nodes": 1, "gpus_per_node": 2},
            "meta": meta or {},
        }
    ]
    for i, (t, kind, fields) in enumerate(recs, 1):
        out.append({"seq": i, "t": t, "kind": kind, **fields})
    return out


def _names(violations):
    return sorted(v.invariant for v in violations)


def _join(t, name, member, members):
    return (t, "rendezvous_join", {"pipeline_id": "p", "name": name, "member": member, "members": members})


# ---------------------------------------------------------------- crafted logs
def test_deadlock_fires_on_a_cycle_of_joins_and_names_every_member_and_record():
    recs = [_join(0.0, "g0", "a", ["a", "b"]), _join(0.0, "g1", "b", ["a", "b"])]
    found = check_log(_log(*recs), ["deadlock"])
    assert len(found) == 1
    msg = found[0].message
    assert "p/a" in msg and "p/b" in msg and "records 1, 2" in msg and "join of p/g0, seq 1" in msg
    # the same joins, the first group completed: no cycle
    done = recs + [(1.0, "rendezvous_done", {"pipeline_id": "p", "name": "g0", "members": ["a", "b"]})]
    assert check_log(_log(*done), ["deadlock"]) == []


def test_lost_wakeup_fires_when_a_broadcast_waits_on_an_exited_receiver():
    start = (0.0, "broadcast_start", {"pipeline_id": "p", "name": "g", "src": "s", "dsts": ["r"]})
    exit_ = (1.0, "member_exit", {"pipeline_id": "p", "member": "r", "reason": "killed"})
    found = check_log(_log(start, exit_), ["lost_wakeup"])
    assert (
        _names(found) == ["lost_wakeup"] and "p/s waits" in found[0].message and "exited at seq 2" in found[0].message
    )
    ended = (2.0, "broadcast_end", {"pipeline_id": "p", "name": "g", "src": "s", "ok": False, "error": "timed out"})
    assert check_log(_log(start, exit_, ended), ["lost_wakeup"]) == []
    # a receiver that posted its receive is not waited on (it exits later: nothing to wake)
    posted = (0.5, "broadcast_recv", {"pipeline_id": "p", "name": "g", "member": "r", "src": "s"})
    assert check_log(_log(start, posted), ["lost_wakeup", "deadlock"]) == []


def test_hot_state_fires_past_the_bound_from_the_header_and_not_before():
    join = _join(0.0, "g", "a", ["a", "b"])
    end = (100.0, "sim_end", {"reason": "horizon", "sim_time": 100.0, "events": 1})
    assert check_log(_log(join, end), ["hot_state"]) == []  # 100 s < the 300 s default bound
    short = {
        "timeouts": {"await_release_s": 50.0, "resize_lock_s": 20.0, "selective_sync_s": 10.0, "shrink_drain_s": 5.0}
    }
    found = check_log(_log(join, end, meta=short), ["hot_state"])
    assert _names(found) == ["hot_state"]
    assert "p/a hot in the join of p/g" in found[0].message and "50 s bound" in found[0].message
    assert "p/a -[join of p/g, seq 1]-> p/b" in found[0].message


def _requests(ts):
    return [
        (t, "request_done", {"pipeline_id": "p", "request": i, "dp_rank": 0, "tokens": 8}) for i, t in enumerate(ts)
    ]


def test_livelock_fires_on_work_without_a_step_and_not_on_a_stall_or_a_step():
    reg = (0.0, "register", {"pipeline_id": "p", "cluster_tp_configs": {}, "cluster_device_mappings": {}})
    end = (1000.0, "sim_end", {"reason": "horizon", "sim_time": 1000.0, "events": 1})
    busy = _requests([10.0 * i for i in range(1, 99)])
    found = check_log(_log(reg, *busy, end), ["livelock"])
    assert _names(found) == ["livelock"] and "98 request(s)" in found[0].message
    # a step completed late enough: the work since it is shorter than the bound
    step = (900.0, "batch_consumed", {"pipeline_id": "p", "step": 0, "trajectories": 4, "staleness": {}})
    assert check_log(_log(reg, *busy[:90], step, *busy[90:], end), ["livelock"]) == []
    # requests that stopped finishing early: a stall (liveness's), not a livelock
    assert check_log(_log(reg, *_requests([10.0, 20.0]), end), ["livelock"]) == []


# ---------------------------------------------------------------- real runs
def _run(name, explore=None, **replace):
    scen = load_scenario(ROOT / "examples" / "scenarios" / f"{name}.yaml")
    if replace:
        scen = dataclasses.replace(scen, **replace)
    return Simulation(scen, explore=explore).run()


def test_slime_2331_deadlock_is_found_by_an_explore_seed_not_by_the_fixed_order():
    assert check_log(_run("wsg_slime2331_opposite_arrival").records, NEW) == []
    res = _run("wsg_slime2331_opposite_arrival", ExploreSpec(0, "pct"))
    found = check_log(res.records, NEW)
    assert _names(found) == ["deadlock", "hot_state"]
    dead = next(v for v in found if v.invariant == "deadlock").message
    assert "p0/eng0" in dead and "p0/eng1" in dead and "join of p0/pp0" in dead and "join of p0/pp1" in dead


def test_vime_329_slot_overwrite_is_a_cycle_through_the_trainer_barrier():
    found = check_log(_run("wsg_vime329_slot_overwrite").records, NEW)
    assert _names(found) == ["deadlock", "deadlock", "hot_state"]
    assert all(
        "receive on p0/pp1" in v.message and "broadcast on p0/pp0" in v.message and "join of p0/train" in v.message
        for v in found
        if v.invariant == "deadlock"
    )


def test_trl_6913_broadcast_without_timeout_is_a_lost_wakeup_and_the_fix_fails_fast():
    found = check_log(_run("wsg_trl6913_receiver_died").records, NEW)
    assert _names(found) == ["hot_state", "lost_wakeup"]
    res = _run("wsg_trl6913_broadcast_timeout")
    assert res.reason == "failed" and "timed out after 150 s" in res.detail
    assert check_log(res.records, NEW) == []


@pytest.mark.parametrize("name", ["wsg_slime2331_phased", "wsg_vime329_per_group", "wsg_trl6913_broadcast_timeout"])
def test_fixed_variants_stay_clean_under_exploration(name):
    for strategy in ("random", "pct"):
        for seed in range(3):
            assert check_log(_run(name, ExploreSpec(seed, strategy)).records, NEW) == [], (strategy, seed)


def test_the_age0_bug_fault_recreates_the_livelock_for_a_real_run():
    scen = load_scenario(ROOT / "examples" / "fuzz" / "nemo_age0_never_trains.yaml")
    res = Simulation(dataclasses.replace(scen, faults=(FaultSpec("unclamped_base_stamp", "p0", 0),))).run()
    found = check_log(res.records)
    assert _names(found) == ["livelock"]
    done = sum(1 for r in res.records if r["kind"] == "request_done")
    assert done > 1000 and f"{done} request(s)" in found[0].message
    assert not any(r["kind"] == "batch_consumed" for r in res.records)


def test_an_explored_field_report_run_is_byte_identical_when_rerun():
    a = _run("wsg_slime2331_opposite_arrival", ExploreSpec(3, "random"))
    b = _run("wsg_slime2331_opposite_arrival", ExploreSpec(3, "random"))
    assert list(a.log.lines()) == list(b.log.lines())


def _lock(t, kind, effect, scope, cycle=None, **extra):
    return (t, kind, {"pipeline_id": "p", "effect": effect, "args": {}, "scope": scope, "cycle": cycle, **extra})


def test_coordinator_lock_waits_are_edges_and_a_free_lock_with_a_waiter_is_a_lost_wakeup():
    held = [
        _lock(0.0, "effect_start", "LockCoordinator", "step"),
        _lock(0.0, "effect_end", "LockCoordinator", "step"),
        _lock(1.0, "effect_start", "LockCoordinator", "shrink", 4),
    ]
    end = (500.0, "sim_end", {"reason": "horizon", "sim_time": 500.0, "events": 1})
    found = check_log(_log(*held, end), NEW)
    # waiting on a live holder is no lost wakeup; held past the bound it is a hot state with its chain
    assert (
        _names(found) == ["hot_state"]
        and "p/shrink@cycle4 -[coordinator lock of p, seq 3]-> p/step" in found[0].message
    )
    released = held + [
        _lock(2.0, "effect_start", "UnlockCoordinator", "step"),
        _lock(2.0, "effect_end", "UnlockCoordinator", "step"),
    ]
    lost = check_log(_log(*released, end), ["lost_wakeup"])
    assert _names(lost) == ["lost_wakeup"] and "released at seq 5" in lost[0].message
    # handed on: the waiter got the lock
    handed = released + [_lock(2.0, "effect_end", "LockCoordinator", "shrink", 4)]
    assert check_log(_log(*handed, end), ["lost_wakeup", "deadlock"]) == []


def test_a_lock_release_that_forgets_its_waiter_is_a_lost_wakeup_on_a_real_run():
    scen = load_scenario(ROOT / "examples" / "scenarios" / "ungrantable_preemption.yaml")
    faults = tuple(FaultSpec("lost_lock_handoff", p.name, 0) for p in scen.pipelines)
    res = Simulation(dataclasses.replace(scen, faults=faults)).run()
    lost = check_log(res.records, ["lost_wakeup"])
    assert len(lost) == 1 and "coordinator lock" in lost[0].message and "never woken" in lost[0].message
    assert check_log(Simulation(scen).run().records, ["lost_wakeup", "deadlock"]) == []


def test_liveness_names_the_chain_of_a_stalled_lock_wait_and_takes_its_window_from_the_header():
    held = [
        _lock(0.0, "effect_start", "LockCoordinator", "step"),
        _lock(0.0, "effect_end", "LockCoordinator", "step"),
        _lock(1.0, "effect_start", "LockCoordinator", "shrink", 4),
    ]
    end = (200.0, "sim_end", {"reason": "horizon", "sim_time": 200.0, "events": 1})
    assert check_log(_log(*held, end), ["liveness"]) == []  # 199 s < RLix's 300 s
    short = {
        "timeouts": {"await_release_s": 100.0, "resize_lock_s": 60.0, "selective_sync_s": 50.0, "shrink_drain_s": 5.0}
    }
    found = check_log(_log(*held, end, meta=short), ["liveness"])
    assert len(found) == 1 and "p stuck in LockCoordinator" in found[0].message and "last 100 s" in found[0].message
    assert "chain of waits: p/shrink@cycle4 -[coordinator lock of p, seq 3]-> p/step" in found[0].message
