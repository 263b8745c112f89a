"""Scheduler behaviours pinned by RLix's own unit tests (docs/modelled-systems.md#rlix-unit-tests-rewritten-as-properties), rewritten
here from the described behaviour: gap-ratio cases, scheduling-cycle cases, stale-plan
rules, and the documented hazards with their fixed variants."""

from __future__ import annotations

import pytest

from harness.scheduler import Priority, Rejected, SchedulerModel, SchedulerOptions
from harness.scheduler.progress import ProgressReport
from harness.scheduler.topology import ClusterTopology

GEN, TRN, INIT = Priority.GENERATION, Priority.ACTOR_TRAINING, Priority.INITIALIZATION


def model(gpus=4, nodes=1, **opts) -> SchedulerModel:
    return SchedulerModel(ClusterTopology(nodes, gpus), SchedulerOptions(**opts))


def add(m, pid, infer, tp=1, train=None, **extra):
    tps = {"actor_infer": tp}
    maps = {"actor_infer": infer}
    if train is not None:
        tps["actor_train"] = 1
        maps["actor_train"] = train
    for name, mapping in extra.items():
        tps[name] = 1
        maps[name] = mapping
    m.register(pid, tps, maps)
    m.admit(pid)


def plan_of(m):
    recs = [r for r in m.drain() if r["kind"] == "plan"]
    return recs[-1] if recs else None


def active(m, pid):
    a = m.state.allocations.get(f"{pid}_actor_infer")
    return sorted(a.active_dp_ranks) if a else []


# ---------------------------------------------------------------- gap ratio


def test_idle_gpus_are_activated_for_a_single_pipeline():
    m = model(4)
    add(m, "p", [0, 1, 2, 3])
    m.request("p_actor_infer", GEN, step_target_estimate=8)
    sig = m.run_cycle()
    assert active(m, "p") == [0, 1, 2, 3]
    assert sig[0].gpus == [0, 1, 2, 3] and sig[0].cycle == 1
    assert m.state.idle_gpus == set()


def test_pending_request_bootstraps_demand_from_estimate():
    m = model(4)
    add(m, "a", [0, 1, 2, 3])
    add(m, "b", [0, 1, 2, 3])
    m.request("a_actor_infer", GEN, step_target_estimate=3)
    m.request("b_actor_infer", GEN, step_target_estimate=1)
    m.run_cycle()
    # weights: a = 3+3 (inflated), b = 1+1 -> 4 GPUs split 3:1
    assert (len(active(m, "a")), len(active(m, "b"))) == (3, 1)


def test_no_progress_and_no_estimate_means_no_allocation():
    m = model(2)
    add(m, "p", [0, 1])
    t = m.request("p_actor_infer", GEN)
    assert m.run_cycle() == [] and not t.done
    assert active(m, "p") == [] and m.state.idle_gpus == {0, 1}
    assert m.state.pending[GEN][0].cluster_id == "p_actor_infer"  # still waiting (debug #27 shape)


def test_real_progress_overrides_the_estimate():
    m = model(4)
    add(m, "a", [0, 1, 2, 3])
    add(m, "b", [0, 1, 2, 3])
    m.report_progress(ProgressReport("a", step_target=10, completed=9))  # remaining 1 (+10 inflation)
    m.report_progress(ProgressReport("b", step_target=10, completed=0))  # remaining 10 (+10)
    m.request("a_actor_infer", GEN, step_target_estimate=1000)
    m.request("b_actor_infer", GEN, step_target_estimate=1)
    m.run_cycle()
    assert (len(active(m, "a")), len(active(m, "b"))) == (1, 3)


def test_over_provisioned_pipeline_donates_to_under_provisioned_one():
    m = model(4)
    add(m, "a", [0, 1, 2, 3])
    add(m, "b", [0, 1, 2, 3])
    m.request("a_actor_infer", GEN, step_target_estimate=4)
    m.run_cycle()
    assert active(m, "a") == [0, 1, 2, 3]
    m.drain()
    m.report_progress(ProgressReport("a", step_target=4, completed=3))
    m.request("b_actor_infer", GEN, step_target_estimate=4)
    m.run_cycle()
    plan = plan_of(m)
    shrinks = {s["cluster_id"]: [b["dp_rank"] for b in s["bundles"]] for s in plan["shrinks"]}
    expands = {e["cluster_id"]: [b["dp_rank"] for b in e["bundles"]] for e in plan["expands"]}
    assert "a_actor_infer" in shrinks and "b_actor_infer" in expands
    # donors give up ranks whose GPUs the receiver takes: same GPUs, different owners
    assert set(active(m, "a")).isdisjoint(active(m, "b"))
    assert len(active(m, "b")) == 3 and len(active(m, "a")) == 1


def test_ineligible_receiver_causes_no_donor_mutation():
    """A pipeline with progress but no pending request and no allocation is not a
    receiver; the planner must not shrink donors on its behalf."""
    m = model(2)
    add(m, "a", [0, 1])
    add(m, "b", [0, 1])
    m.request("a_actor_infer", GEN, step_target_estimate=2)
    m.run_cycle()
    m.drain()
    m.report_progress(ProgressReport("a", step_target=10, completed=10))  # a is done
    m.report_progress(ProgressReport("b", step_target=10, completed=0))  # b has demand, no request
    m.run_cycle()
    plan = plan_of(m)
    assert plan["shrinks"] == [] and plan["expands"] == []
    assert active(m, "a") == [0, 1]


def test_registration_without_actor_infer_is_refused():
    m = model(2)
    with pytest.raises(Rejected, match="actor_infer"):
        m.register("p", {"actor_train": 1}, {"actor_train": [0]})


def test_tp2_grants_whole_bundles():
    m = model(4)
    add(m, "p", [0, 1, 2, 3], tp=2)
    m.request("p_actor_infer", GEN, step_target_estimate=1)
    m.run_cycle()
    alloc = m.state.allocations["p_actor_infer"]
    assert alloc.dp_rank_to_gpus == {0: [0, 1], 1: [2, 3]}


# ---------------------------------------------------------------- scheduling cycle


def test_cycle_grants_non_generation_request_its_whole_mapping_and_signals():
    m = model(4)
    add(m, "p", [0, 1, 2, 3], train=[0, 1])
    t = m.request("p_actor_train", TRN, global_step=0)
    assert not t.done
    sig = m.run_cycle()
    assert [(s.request_id, s.gpus, s.priority) for s in sig] == [(t.request_id, [0, 1], TRN)]
    assert sorted(m.state.allocations["p_actor_train"].gpu_ids) == [0, 1]


def test_cycle_expands_generation_with_progress_and_signals_after_resize():
    m = model(4)
    add(m, "p", [0, 1, 2, 3])
    m.report_progress(ProgressReport("p", step_target=8, completed=4))  # 50 %
    t = m.request("p_actor_infer", GEN)
    cp = m.plan_cycle()
    assert [c.dp_ranks_to_add for c in cp.expand_calls] == [[0, 1, 2, 3]]
    assert not any(r["kind"] == "signalled" for r in m.drain())  # nobody signalled before commit
    sig = m.commit_cycle(cp)
    assert sig[0].request_id == t.request_id and sig[0].gpus == [0, 1, 2, 3]


def test_non_gen_request_preempts_only_overlapping_generation_ranks():
    m = model(2)
    add(m, "p", [0, 1], train=[0])
    m.request("p_actor_infer", GEN, step_target_estimate=1)
    m.run_cycle()
    m.drain()
    m.request("p_actor_train", TRN)
    m.run_cycle()
    plan = plan_of(m)
    assert plan["shrinks"] == [{"cluster_id": "p_actor_infer", "bundles": [{"dp_rank": 0, "gpus": [0]}]}]
    assert active(m, "p") == [1]  # the non-overlap rank keeps serving


def test_shrink_order_all_shrinks_before_expands_and_signal_after():
    m = model(4)
    add(m, "a", [0, 1, 2, 3])
    add(m, "b", [0, 1, 2, 3])
    m.request("a_actor_infer", GEN, step_target_estimate=4)
    m.run_cycle()
    m.report_progress(ProgressReport("a", step_target=4, completed=3))
    m.request("b_actor_infer", GEN, step_target_estimate=4)
    m.drain()
    m.run_cycle()
    kinds = [(r["kind"], r.get("phase")) for r in m.drain()]
    order = [k for k in kinds if k[0] in ("resize_start", "resize_end", "signalled")]
    assert order == [
        ("resize_start", "shrink"),
        ("resize_end", "shrink"),
        ("resize_start", "expand"),
        ("resize_end", "expand"),
        ("signalled", None),
    ]


def test_request_with_existing_same_priority_allocation_returns_at_once():
    m = model(2)
    add(m, "p", [0, 1], train=[0])
    m.request("p_actor_train", TRN)
    m.run_cycle()
    t = m.request("p_actor_train", TRN)
    assert t.done and t.gpus == [0]
    with pytest.raises(Rejected, match="already allocated with priority"):
        m.request("p_actor_train", INIT)


def test_release_then_request_rejects_equal_priorities_and_releases_first():
    m = model(2)
    add(m, "p", [0, 1], train=[0])
    m.request("p_actor_train", Priority.OLD_LOG_PROBS)
    m.run_cycle()
    with pytest.raises(Rejected, match="no-op"):
        m.release_then_request("p_actor_train", "p_actor_train", Priority.OLD_LOG_PROBS)
    t = m.release_then_request("p_actor_train", "p_actor_train", TRN)
    assert not t.done and 0 in m.state.idle_gpus
    assert m.run_cycle()[0].gpus == [0]


def test_await_release_is_idempotent_and_immediate_when_nothing_active():
    m = model(2)
    add(m, "p", [0, 1])
    m.request("p_actor_infer", GEN, step_target_estimate=1)
    m.run_cycle()
    t1 = m.await_release(pipeline_id="p")
    t2 = m.await_release(cluster_id="p_actor_infer")
    assert t1.request_id == t2.request_id and not t1.done
    sig = m.run_cycle()
    assert [(s.kind, s.shrink_executed) for s in sig] == [("planned_release", True)]
    assert active(m, "p") == [] and "p_actor_infer" in m.state.allocations  # suspended, not removed
    assert m.await_release(pipeline_id="p").done


# ---------------------------------------------------------------- stale plans (lock gap)


def test_unregister_in_lock_gap_skips_stale_ops_and_leaves_gpus_idle():
    m = model(2)
    add(m, "p", [0, 1], train=[0])
    m.request("p_actor_infer", GEN, step_target_estimate=1)
    cp = m.plan_cycle()
    errs = m.unregister("p")
    assert [s.error for s in errs] == ["Pipeline 'p' unregistered"]
    assert m.commit_cycle(cp) == []
    assert m.state.idle_gpus == {0, 1} and m.state.allocations == {}
    commit = [r for r in m.drain() if r["kind"] == "commit"][0]
    assert commit["skipped_stale"] == ["expand p_actor_infer"]


def test_stale_grant_with_waiter_still_present_is_cleanup_corruption():
    m = model(2)
    add(m, "p", [0, 1], train=[0])
    m.request("p_actor_train", TRN)
    cp = m.plan_cycle()
    del m.state.registry["p"]  # registry entry gone but the waiter left behind
    assert m.commit_cycle(cp) == []
    assert m.failed and "cleanup corruption" in m.failed
    with pytest.raises(Rejected, match="failed fast"):
        m.request("p_actor_train", TRN)


# ---------------------------------------------------------------- hazards (RLix default vs fixed)


def _gen_holder_and_lock_gap(m):
    add(m, "p", [0, 1])
    m.request("p_actor_infer", GEN, step_target_estimate=1)
    m.run_cycle()
    cp = m.plan_cycle()
    t = m.await_release(pipeline_id="p")  # arrives in the lock gap: not in this plan
    return cp, t


def test_premature_planned_release_ack_is_reproduced_by_default():
    m = model(2)
    cp, t = _gen_holder_and_lock_gap(m)
    sig = m.commit_cycle(cp)
    assert [(s.request_id, s.shrink_executed) for s in sig] == [(t.request_id, False)]
    assert active(m, "p") == [0, 1]  # acked although nothing was released


def test_fixed_variant_acks_only_after_the_shrink_ran():
    m = model(2, ack_unplanned_releases=False)
    cp, t = _gen_holder_and_lock_gap(m)
    assert m.commit_cycle(cp) == []
    sig = m.run_cycle()
    assert [(s.request_id, s.shrink_executed) for s in sig] == [(t.request_id, True)]
    assert active(m, "p") == []


def _ungrantable_setup(m):
    # b's training mapping [0, 1] overlaps a's training GPU 1 (held) and a GEN rank on 0
    add(m, "a", [2, 3], train=[1])
    add(m, "b", [0, 2, 3], train=[0, 1])
    m.request("a_actor_train", TRN)
    m.run_cycle()
    m.request("b_actor_infer", GEN, step_target_estimate=1)
    m.run_cycle()
    m.drain()
    m.request("b_actor_train", TRN)
    m.run_cycle()
    return plan_of(m)


def test_generation_is_preempted_for_an_ungrantable_request_by_default():
    m = model(4)
    plan = _ungrantable_setup(m)
    assert plan["signals"] == []  # b_actor_train cannot be granted (GPU 1 held by a)
    assert plan["shrinks"] and plan["shrinks"][0]["cluster_id"] == "b_actor_infer"


def test_rollback_variant_keeps_generation_running():
    m = model(4, rollback_ungrantable_preemption=True)
    plan = _ungrantable_setup(m)
    assert plan["signals"] == [] and plan["shrinks"] == []


def _hol_setup(m):
    add(m, "big", [0, 1, 2, 3], train=[0, 1, 2, 3])
    add(m, "small", [0, 1, 2, 3], train=[3])
    add(m, "holder", [0, 1, 2, 3], train=[0])
    m.request("holder_actor_train", TRN)
    m.run_cycle()
    m.request("big_actor_train", TRN)  # needs GPU 0, held by holder: cannot be granted
    m.request("small_actor_train", TRN)  # later, smaller: overtakes without HOL blocking
    return m.run_cycle()


def test_no_head_of_line_blocking_by_default():
    m = model(4)
    sig = _hol_setup(m)
    assert [s.cluster_id for s in sig] == ["small_actor_train"]


def test_head_of_line_blocking_variant_holds_later_requests():
    m = model(4, head_of_line_blocking=True)
    assert _hol_setup(m) == []


# ---------------------------------------------------------------- release_then_request of one cluster

OLP = Priority.OLD_LOG_PROBS


def _same_cluster_release_then_request(**opts):
    """a holds [0, 1] at OLD_LOG_PROBS; b (train [1]) waits at ACTOR_TRAINING; then a releases
    and re-requests itself at ACTOR_TRAINING (RLix's ROLL Phase 16)."""
    m = model(4, **opts)
    add(m, "a", [0, 1, 2, 3], train=[0, 1])
    add(m, "b", [1, 2, 3], train=[1])
    m.request("a_actor_train", OLP)
    m.run_cycle()
    tb = m.request("b_actor_train", TRN)
    m.run_cycle()
    assert not tb.done  # GPU 1 is a's
    ta = m.release_then_request("a_actor_train", "a_actor_train", TRN)
    signals = m.run_cycle()
    return m, {s.cluster_id: s.gpus for s in signals}, ta


def test_rlix_gives_a_same_cluster_release_to_the_earlier_same_tier_request():
    m, granted, _ = _same_cluster_release_then_request()
    assert granted == {"b_actor_train": [1]}  # b was first in the ACTOR_TRAINING tier
    assert "a_actor_train" not in m.state.allocations


def test_reserve_same_cluster_release_keeps_the_gpus_for_the_releasing_cluster():
    m, granted, _ = _same_cluster_release_then_request(reserve_same_cluster_release=True)
    assert granted == {"a_actor_train": [0, 1]}
    assert m.state.held_for == {}  # the reservation ends with the grant
    m.release("a_actor_train")
    assert {s.cluster_id: s.gpus for s in m.run_cycle()} == {"b_actor_train": [1]}
