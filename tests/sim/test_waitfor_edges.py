"""The wait-for graph's scheduler and cache-lock edges (harness/logs/invariants/waitfor_edges.py):
each edge type makes ``deadlock`` or ``lost_wakeup`` fire on a crafted log and stays quiet
once the wait is answered; the faults ``lost_release_ack`` and ``lost_cache_handoff``
make ``lost_wakeup`` fire on real runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.logs.invariants import check_log
from harness.logs.invariants.waitfor import wait_graph
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario
from simulators.scenario.spec import FaultSpec

ROOT = Path(__file__).resolve().parents[2]
GRAPH = ["deadlock", "lost_wakeup"]


def _log(*recs):
    out = [
        {
            "seq": 0,
            "t": 0.0,
            "kind": "header",
            "schema": "rlharness.eventlog",
            "version": 1,
            "cluster": {"nodes": 1, "gpus_per_node": 4},
        }
    ]
    for i, (t, kind, fields) in enumerate(recs, 1):
        out.append({"seq": i, "t": t, "kind": kind, **fields})
    return out


def _reg(pid, **mappings):
    return (
        0.0,
        "register",
        {"pipeline_id": pid, "cluster_tp_configs": {c: 1 for c in mappings}, "cluster_device_mappings": mappings},
    )


def _effect(t, kind, pid, effect, scope, cycle=None, **args):
    return (t, kind, {"pipeline_id": pid, "effect": effect, "args": args, "scope": scope, "cycle": cycle})


def _request(t, pid, cluster, rid, priority="ACTOR_TRAINING"):
    """A call's RequestGpus effect and the request it enqueues (the effect stays open)."""
    return [
        _effect(t, "effect_start", pid, "RequestGpus", "step", cluster=cluster),
        (t, "enqueued", {"request_id": rid, "cluster_id": f"{pid}_{cluster}", "priority": priority}),
    ]


def _grant(t, pid, cluster, rid, gpus, cycle, priority="ACTOR_TRAINING"):
    """A cycle that grants the request, and the call's effect ending with the GPUs."""
    cid = f"{pid}_{cluster}"
    return [
        (
            t,
            "plan",
            {
                "cycle": cycle,
                "shrinks": [],
                "expands": [],
                "signals": [{"cluster_id": cid, "priority": priority, "gpus": gpus}],
            },
        ),
        (
            t,
            "signalled",
            {
                "request_id": rid,
                "waiter": "request",
                "cluster_id": cid,
                "priority": priority,
                "gpus": gpus,
                "cycle": cycle,
                "error": None,
            },
        ),
        (t, "commit", {"cycle": cycle, "idle_gpus": 0, "skipped_stale": []}),
        _effect(t, "effect_end", pid, "RequestGpus", "step", cluster=cluster),
    ]


def _signal(t, rid, cid, waiter="request", error=None):
    return (
        t,
        "signalled",
        {
            "request_id": rid,
            "waiter": waiter,
            "cluster_id": cid,
            "priority": None,
            "gpus": [],
            "cycle": None,
            "error": error,
        },
    )


# ---------------------------------------------------------------- requests and their holders
def test_two_requests_each_needing_the_others_gpus_are_a_deadlock_through_their_holders():
    recs = [
        _reg("a", actor_train=[0], critic=[1]),
        _reg("b", actor_train=[1], critic=[0]),
        *_request(1.0, "a", "actor_train", 1),
        *_grant(1.0, "a", "actor_train", 1, [0], 1),
        *_request(1.0, "b", "actor_train", 2),
        *_grant(1.0, "b", "actor_train", 2, [1], 2),
        *_request(2.0, "a", "critic", 3),
        *_request(2.0, "b", "critic", 4),
    ]
    found = check_log(_log(*recs), GRAPH)
    assert [v.invariant for v in found] == ["deadlock"]
    msg = found[0].message
    assert "among a/step, b/step" in msg and "records 16, 18" in msg
    assert "request 3 of a_critic at ACTOR_TRAINING: GPUs [1] held by b_actor_train" in msg
    assert "request 4 of b_critic at ACTOR_TRAINING: GPUs [0] held by a_actor_train" in msg
    # b gives its GPUs back first (release): a's request no longer waits on b, no cycle
    freed = recs + [(3.0, "released", {"cluster_id": "b_actor_train", "gpus": [1], "reason": "release"})]
    assert check_log(_log(*freed), GRAPH) == []
    # a GENERATION holder is the scheduler's to shrink: no one's wait
    gen = [
        _reg("a", actor_train=[0], actor_infer=[1]),
        _reg("b", actor_train=[1], actor_infer=[0]),
        *_request(1.0, "a", "actor_infer", 1, "GENERATION"),
        *_grant(1.0, "a", "actor_infer", 1, [1], 1, "GENERATION"),
        *_request(2.0, "b", "actor_train", 2),
    ]
    g = wait_graph(_log(*gen))
    assert [(w.waiter, w.on) for w in g.waits] == [("b/step", "scheduler")]


def test_a_request_waits_through_the_scheduler_on_a_resize_that_waits_on_the_requests_lock_holder():
    recs = [
        _reg("a", actor_train=[0], actor_infer=[1]),
        _effect(1.0, "effect_start", "a", "LockCoordinator", "step"),
        _effect(1.0, "effect_end", "a", "LockCoordinator", "step"),
        *_request(2.0, "a", "actor_train", 1),
        (3.0, "resize_start", {"cycle": 7, "pipeline_id": "a", "phase": "shrink", "dp_ranks": [0]}),
        _effect(3.0, "effect_start", "a", "LockCoordinator", "shrink", 7),
    ]
    found = check_log(_log(*recs), GRAPH)
    assert [v.invariant for v in found] == ["deadlock"]
    assert (
        "a/shrink@cycle7 -[coordinator lock of a, seq 7]-> a/step -[request 1 of a_actor_train at "
        "ACTOR_TRAINING, seq 5]-> scheduler -[shrink resize of cycle 7, seq 6]-> a/shrink@cycle7"
    ) in found[0].message
    done = recs + [(4.0, "resize_end", {"cycle": 7, "pipeline_id": "a", "phase": "shrink", "dp_ranks": [0]})]
    assert check_log(_log(*done), GRAPH) == []


# ---------------------------------------------------------------- lost wakeups of the scheduler
def test_a_request_left_pending_by_a_failed_scheduler_or_an_unregister_is_a_lost_wakeup():
    base = [_reg("a", actor_train=[0]), *_request(1.0, "a", "actor_train", 1)]
    failed = base + [(2.0, "scheduler_failed", {"cycle": 3, "reason": "plan validation failed"})]
    found = check_log(_log(*failed), GRAPH)
    assert [v.invariant for v in found] == ["lost_wakeup"]
    assert "a/step waits" in found[0].message and "on scheduler, which exited at seq 4" in found[0].message
    assert check_log(_log(*failed, _signal(2.0, 1, "a_actor_train", error="scheduler_loop_failed")), GRAPH) == []
    # a failed scheduler waits on nothing: not on the resize it was in
    resizing = base + [(1.5, "resize_start", {"cycle": 3, "pipeline_id": "a", "phase": "shrink", "dp_ranks": [0]})]
    assert [w.on for w in wait_graph(_log(*resizing)).waits] == ["scheduler", "a/shrink@cycle3"]
    assert [w.waiter for w in wait_graph(_log(*resizing, failed[-1])).waits] == ["a/step"]
    gone = base + [(2.0, "unregister", {"pipeline_id": "a"})]
    found = check_log(_log(*gone), GRAPH)
    assert [v.invariant for v in found] == ["lost_wakeup"] and "a unregistered at seq 4 without signalling it" in found[
        0
    ].message
    assert check_log(_log(*gone, _signal(2.0, 1, "a_actor_train", error="unregistered")), GRAPH) == []
    # a request with no effect open (NeMo's watchdog) is named by its pipeline and cluster
    bare = [
        _reg("a", actor_infer=[0]),
        (1.0, "enqueued", {"request_id": 1, "cluster_id": "a_actor_infer", "priority": "GENERATION"}),
        (2.0, "unregister", {"pipeline_id": "a"}),
    ]
    assert "a/request:actor_infer waits" in check_log(_log(*bare), GRAPH)[0].message


def _holding_gen(pid="a"):
    cid = f"{pid}_actor_infer"
    return [
        _reg(pid, actor_infer=[0, 1]),
        (
            0.5,
            "plan",
            {
                "cycle": 1,
                "shrinks": [],
                "signals": [],
                "expands": [
                    {
                        "cluster_id": cid,
                        "has_pending_request": False,
                        "bundles": [{"dp_rank": 0, "gpus": [0]}, {"dp_rank": 1, "gpus": [1]}],
                    }
                ],
            },
        ),
        (0.5, "commit", {"cycle": 1, "idle_gpus": 2, "skipped_stale": []}),
        _effect(1.0, "effect_start", pid, "AwaitRelease", "step"),
        (1.0, "release_pending", {"request_id": 5, "cluster_id": cid, "dp_ranks": [0, 1]}),
        (
            2.0,
            "plan",
            {
                "cycle": 2,
                "signals": [],
                "expands": [],
                "shrinks": [{"cluster_id": cid, "bundles": [{"dp_rank": 0, "gpus": [0]}, {"dp_rank": 1, "gpus": [1]}]}],
            },
        ),
    ]


def test_an_await_release_never_acked_after_its_cluster_is_freed_is_a_lost_wakeup():
    commit = (2.0, "commit", {"cycle": 2, "idle_gpus": 4, "skipped_stale": []})
    found = check_log(_log(*_holding_gen(), commit), GRAPH)
    assert [v.invariant for v in found] == ["lost_wakeup"]
    assert (
        "a/step waits (since t=1.0s, seq 5, await_release of a_actor_infer (request 5)) on scheduler: its cluster "
        "a_actor_infer held no GPU after the commit of cycle 2 (seq 7), which did not ack it"
    ) in found[0].message
    # acked at that commit: nothing open
    acked = _holding_gen() + [_signal(2.0, 5, "a_actor_infer", "planned_release"), commit]
    assert check_log(_log(*acked), GRAPH) == []
    # still shrinking (no commit yet): it waits on the scheduler, nothing lost
    assert check_log(_log(*_holding_gen()), GRAPH) == []


# ---------------------------------------------------------------- the cache owner's lock
def _cache(t, action, holder):
    return (t, "cache_lock", {"pipeline_id": "p", "action": action, "holder": holder, "version": 1})


def test_cache_lock_waiters_wait_on_the_holding_call_and_a_release_without_hand_off_is_a_lost_wakeup():
    held = [
        _effect(0.0, "effect_start", "p", "SyncFromCache", "expand", 3, ranks=[0], version=1),
        _cache(0.0, "acquire", "sync"),
        _effect(1.0, "effect_start", "p", "BuildCache", "step", version=2),
    ]
    g = wait_graph(_log(*held))
    assert [(w.waiter, w.on, w.what) for w in g.waits] == [
        ("p/step", "p/expand@cycle3", "cache lock of p for its build (held by its sync)")
    ]
    assert check_log(_log(*held), GRAPH) == []
    released = held + [
        _cache(2.0, "release", "sync"),
        (3.0, "sim_end", {"reason": "horizon", "sim_time": 3.0, "events": 1}),
    ]
    found = check_log(_log(*released), GRAPH)
    assert [v.invariant for v in found] == ["lost_wakeup"]
    assert (
        "p/step waits (since t=1.0s, seq 3, cache lock of p for its build) on p: its last holder released it at seq 4"
        in found[0].message
    )
    handed = released[:-1] + [_cache(2.0, "acquire", "build"), released[-1]]
    assert check_log(_log(*handed), GRAPH) == []
    # the holder waits on the waiter's coordinator lock: a cycle through both locks
    cyc = [
        _effect(0.0, "effect_start", "p", "LockCoordinator", "step"),
        _effect(0.0, "effect_end", "p", "LockCoordinator", "step"),
        *held[:2],
        _effect(0.5, "effect_start", "p", "LockCoordinator", "expand", 3),
        held[2],
    ]
    found = check_log(_log(*cyc), GRAPH)
    assert [v.invariant for v in found] == ["deadlock"] and "among p/expand@cycle3, p/step" in found[0].message


# ---------------------------------------------------------------- real runs
def _faulted(scenario, fault, pipeline, step):
    scen = load_scenario(ROOT / "examples" / "scenarios" / f"{scenario}.yaml")
    return Simulation(dataclasses.replace(scen, faults=(FaultSpec(fault, pipeline, step),))).run()


def test_a_commit_that_forgets_a_planned_release_is_a_lost_wakeup_on_a_real_run():
    res = _faulted("roll_dual_4gpu", "lost_release_ack", "ppl1", 1)
    assert res.reason == "failed" and "await_release timed out" in res.detail
    lost = check_log(res.records, GRAPH)
    assert [v.invariant for v in lost] == ["lost_wakeup"]
    assert "ppl1/step waits" in lost[0].message and "held no GPU after the commit of cycle" in lost[0].message


def test_a_cache_lock_release_that_forgets_its_waiter_is_a_lost_wakeup_on_a_real_run():
    res = _faulted("default", "lost_cache_handoff", "ppl2", 3)
    lost = check_log(res.records, GRAPH)
    assert [v.invariant for v in lost] == ["lost_wakeup"]
    assert "ppl2/step waits" in lost[0].message and "cache lock of ppl2 for its build" in lost[0].message


def test_a_watchdog_that_requests_under_the_resize_lock_deadlocks_through_a_request_and_a_lock():
    """RLix's watchdog drops the resize lock before its re-request (nemo_rl_pipeline.py
    _generation_watchdog_loop); the fault keeps it: a cycle through the coordinator lock,
    the GENERATION request and the scheduler's expand, in the fixed order and under every
    schedule seed tried, while RLix's order stays clean under the same seeds."""
    from simulators.runtime.explore import ExploreSpec

    def run(name, explore=None):
        return Simulation(load_scenario(ROOT / "examples" / "scenarios" / f"{name}.yaml"), explore=explore).run()

    res = run("watchdog_request_under_lock")
    assert res.reason == "failed" and "resize_sync_lock timed out after 180 s" in res.detail
    [dead] = check_log(res.records, GRAPH)
    assert dead.invariant == "deadlock" and "among ppl1/expand@cycle45, ppl1/watchdog, scheduler" in dead.message
    assert (
        "ppl1/expand@cycle45 -[coordinator lock of ppl1, seq 927]-> ppl1/watchdog -[request 6 of ppl1_actor_infer "
        "at GENERATION, seq 363]-> scheduler -[expand resize of cycle 45, seq 926]-> ppl1/expand@cycle45"
    ) in dead.message
    for strategy in ("pct", "random"):
        for seed in range(3):
            spec = ExploreSpec(seed, strategy)
            assert [v.invariant for v in check_log(run("watchdog_request_under_lock", spec).records, GRAPH)] == [
                "deadlock"
            ]
            fixed = run("watchdog_snapshot_then_request", spec)
            assert fixed.reason == "done" and check_log(fixed.records) == [], (strategy, seed)
