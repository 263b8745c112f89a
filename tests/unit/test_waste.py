"""Scheduler waste from a crafted log: wasted expands, resize time, idle GPU-time while waiting."""

from __future__ import annotations

import pytest

from harness.logs.outputs.waste import scheduler_waste


def rs(t, kind, phase, ranks, cycle, pid="p"):
    return {"kind": kind, "t": t, "pipeline_id": pid, "phase": phase, "dp_ranks": ranks, "cycle": cycle}


def test_expands_that_serve_nothing_are_wasted():
    log = [
        rs(0.0, "resize_start", "expand", [0, 1], 1),
        rs(2.0, "resize_end", "expand", [0, 1], 1),
        {"kind": "request_dispatch", "t": 3.0, "pipeline_id": "p", "dp_rank": 1},  # served
        rs(5.0, "resize_start", "shrink", [0, 1], 2),
        rs(6.0, "resize_end", "shrink", [0, 1], 2),
        rs(7.0, "resize_start", "expand", [2], 3),
        rs(8.5, "resize_end", "expand", [2], 3),
        {"kind": "request_dispatch", "t": 9.0, "pipeline_id": "q", "dp_rank": 2},  # another pipeline's rank 2
        rs(10.0, "resize_start", "shrink", [2], 4),
        rs(10.5, "resize_end", "shrink", [2], 4),  # wasted
        rs(11.0, "resize_start", "expand", [3], 5),
        rs(12.0, "resize_end", "expand", [3], 5),  # up at the end: wasted
    ]
    (p,) = scheduler_waste(log, t_end=20.0).pipelines
    assert (p.expands, p.wasted_expands) == (3, 2)
    assert p.expand_s == 2.0 + 1.5 + 1.0 and p.shrink_s == 1.0 + 0.5


def test_idle_gpu_time_counts_only_while_a_request_is_queued():
    log = [
        {"kind": "commit", "t": 0.0, "idle_gpus": 4},
        {"kind": "enqueued", "t": 1.0, "request_id": 7},
        {"kind": "commit", "t": 3.0, "idle_gpus": 2},  # 4 idle for 2 s while waiting
        {"kind": "released", "t": 4.0, "gpus": [5]},  # 2 idle for 1 s, then 3
        {"kind": "signalled", "t": 6.0, "request_id": 7},  # 3 idle for 2 s
        {"kind": "commit", "t": 9.0, "idle_gpus": 8},  # nobody waits: not counted
    ]
    w = scheduler_waste(log, t_end=10.0)
    assert w.waiting_s == 5.0
    assert w.idle_gpu_s_while_waiting == 4 * 2 + 2 * 1 + 3 * 2


# ---------------------------------------------------------------- idle GPU-time by cause


def _queued(request, priority="GENERATION", cluster="p_actor_infer", rid=7, t=1.0):
    """The records of a request that is queued: its input (when given), then ``enqueued``."""
    out = [dict(request, t=t)] if request else []
    return out + [{"kind": "enqueued", "t": t, "request_id": rid, "cluster_id": cluster, "priority": priority}]


def _split(log, t_end=5.0):
    w = scheduler_waste([{"kind": "commit", "t": 0.0, "idle_gpus": 2, "cycle": 0}] + log, t_end=t_end)
    assert sum(w.idle_by_cause.values()) == pytest.approx(w.idle_gpu_s_while_waiting)
    return {c: v for c, v in w.idle_by_cause.items() if v}


GEN_REQ = {"kind": "request", "cluster_id": "p_actor_infer", "priority": "GENERATION"}


def test_a_queued_gen_request_with_no_estimate_and_no_progress_is_no_demand():
    assert _split(_queued(GEN_REQ)) == {"no_demand": 2 * 4.0}
    # an estimate of 0 is no demand either (RLix reads only an estimate > 0)
    assert _split(_queued({**GEN_REQ, "step_target_estimate": 0})) == {"no_demand": 2 * 4.0}


def test_a_queued_gen_request_with_demand_left_idle_is_the_planner_cap():
    assert _split(_queued({**GEN_REQ, "step_target_estimate": 8})) == {"planner_cap": 2 * 4.0}
    # demand from a progress report of the pipeline, until it is cleared
    log = [{"kind": "progress", "t": 0.5, "pipeline_id": "p", "step_target": 8, "completed": 1}] + _queued(GEN_REQ)
    log += [{"kind": "clear_progress", "t": 3.0, "pipeline_id": "p"}]
    assert _split(log) == {"planner_cap": 2 * 2.0, "no_demand": 2 * 2.0}


def test_a_queued_non_generation_request_is_ungrantable():
    log = _queued(
        {"kind": "request", "cluster_id": "p_actor_train", "priority": "ACTOR_TRAINING"},
        priority="ACTOR_TRAINING",
        cluster="p_actor_train",
    )
    log += [{"kind": "signalled", "t": 4.0, "request_id": 7}]
    assert _split(log) == {"ungrantable": 2 * 3.0}


def test_an_open_cycle_is_lock_held_and_comes_first():
    log = _queued(
        {"kind": "request", "cluster_id": "p_actor_train", "priority": "ACTOR_TRAINING"},
        priority="ACTOR_TRAINING",
        cluster="p_actor_train",
    )
    log += [
        {"kind": "plan", "t": 2.0, "cycle": 1, "shrinks": [], "signals": [], "expands": []},
        {"kind": "commit", "t": 3.5, "idle_gpus": 1, "cycle": 1},
    ]
    assert _split(log) == {"ungrantable": 2 * 1.0 + 1 * 1.5, "lock_held": 2 * 1.5}


def test_every_cause_in_a_real_run():
    """One bundled scenario per cause, each the cause it is about."""
    import os
    from simulators.runtime.simulation import Simulation
    from simulators.scenario.loader import load_scenario
    from harness.logs.outputs.summary import summarize

    root = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "scenarios")
    for name, cause in (
        ("gen_request_without_demand", "no_demand"),
        ("ungrantable_preemption", "ungrantable"),
        ("finished_pipeline_keeps_gen", "planner_cap"),
        ("default", "lock_held"),
    ):
        w = summarize(Simulation(load_scenario(os.path.join(root, f"{name}.yaml"))).run().records).waste
        assert w.idle_by_cause[cause] > 1.0, (name, w.idle_by_cause)
