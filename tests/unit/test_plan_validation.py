"""validate_plan: one crafted plan per numbered condition (docs/modelled-systems.md#rlix-plan-validation), plus fail-fast.

Every case starts from one valid baseline state and plan and changes exactly one thing,
so the condition number reported is the one that thing breaks. The numbering must match
RLix's ``validate_execution_plan`` so a failure reads the same in a simulator, gate and
real-run trace.
"""

from __future__ import annotations

import copy

import pytest

import harness.scheduler.cycle as cycle_mod
from harness.scheduler.model import SchedulerModel
from harness.scheduler.progress import ProgressReport
from harness.scheduler.types import (
    ClusterAllocation,
    ClusterConfig,
    ExecutionPlan,
    ExpandOp,
    PipelineEntry,
    PlanValidationError,
    Priority,
    Rejected,
    ShrinkOp,
    SignalOp,
)
from harness.scheduler.validation import validate_plan
from harness.scheduler.topology import ClusterTopology

P_INF, P_TRN = "P_actor_infer", "P_actor_train"
Q_INF, Q_TRN = "Q_actor_infer", "Q_actor_train"
UNIVERSE = set(range(8))


def _entry(pid, **clusters):
    return PipelineEntry(
        pipeline_id=pid,
        namespace=f"ns_{pid}",
        clusters={name: ClusterConfig(name, tp, tuple(mapping)) for name, (tp, mapping) in clusters.items()},
        admitted=True,
    )


def _gen(cid, gpu_ids, active, mapping):
    return ClusterAllocation(
        cid, list(gpu_ids), Priority.GENERATION, set(active), {k: list(v) for k, v in mapping.items()}
    )


def baseline():
    """P: infer tp1 on 0..3 (ranks 0,1 active on GPUs 0,1); Q: infer tp2 on 4..7 (rank 0 active)."""
    registry = {
        "P": _entry("P", actor_infer=(1, [0, 1, 2, 3]), actor_train=(1, [0, 1, 2, 3])),
        "Q": _entry("Q", actor_infer=(2, [4, 5, 6, 7]), actor_train=(1, [4, 5])),
    }
    allocations = {
        P_INF: _gen(P_INF, [0, 1], {0, 1}, {0: [0], 1: [1]}),
        Q_INF: _gen(Q_INF, [4, 5], {0}, {0: [4, 5]}),
    }
    idle = {2, 3, 6, 7}
    return registry, allocations, idle


def valid_plan():
    return ExecutionPlan(
        shrinks=[ShrinkOp(P_INF, [1])],
        signals=[SignalOp(P_TRN, [2, 3], Priority.INITIALIZATION, None, 1)],
        expands=[ExpandOp(Q_INF, {1: [6, 7]}, True, 2)],
    )


def run(plan, registry, allocations, idle, universe=UNIVERSE):
    validate_plan(plan, registry=registry, allocations=allocations, idle_gpus=idle, universe=universe)


def test_valid_plan_passes_and_does_not_mutate_inputs():
    registry, allocations, idle = baseline()
    before_allocs = copy.deepcopy(allocations)
    before_idle = set(idle)
    run(valid_plan(), registry, allocations, idle)
    # Validation simulates on copies: the caller's state is untouched.
    assert allocations == before_allocs
    assert idle == before_idle


def test_empty_plan_on_consistent_state_passes():
    registry, allocations, idle = baseline()
    run(ExecutionPlan(), registry, allocations, idle)


def test_shrink_then_grant_of_freed_gpu_passes():
    # Simulation order is shrinks -> removes -> grants -> expands, so a grant may use a
    # GPU freed by a shrink in the same plan.
    registry, allocations, idle = baseline()
    plan = ExecutionPlan(
        shrinks=[ShrinkOp(P_INF, [0, 1])], signals=[SignalOp(P_TRN, [0, 1, 2, 3], Priority.ACTOR_TRAINING, None, 1)]
    )
    run(plan, registry, allocations, idle)


# --------------------------------------------------------------------------- cases
# Each case: (registry, allocations, idle) = baseline(); mutate(...) -> (plan, universe override or None)


def c1_dup_shrink(reg, al, idle):
    return ExecutionPlan(shrinks=[ShrinkOp(P_INF, [0]), ShrinkOp(P_INF, [1])])


def c1_dup_expand(reg, al, idle):
    return ExecutionPlan(expands=[ExpandOp(P_INF, {2: [2]}, False, 1), ExpandOp(P_INF, {3: [3]}, False, 1)])


def c1_dup_signal(reg, al, idle):
    return ExecutionPlan(
        signals=[SignalOp(P_TRN, [2], Priority.INITIALIZATION), SignalOp(P_TRN, [3], Priority.INITIALIZATION)]
    )


def c2_shrink_non_gen_name(reg, al, idle):
    al[P_TRN] = ClusterAllocation(P_TRN, [2, 3], Priority.ACTOR_TRAINING, set(), {0: [2], 1: [3]})
    idle.difference_update({2, 3})
    return ExecutionPlan(shrinks=[ShrinkOp(P_TRN, [0])])


def c2_expand_non_gen_name(reg, al, idle):
    return ExecutionPlan(expands=[ExpandOp(P_TRN, {2: [2]}, False, 1)])


def c2_shrink_gen_cluster_allocated_at_init(reg, al, idle):
    al[P_INF].priority = Priority.INITIALIZATION
    return ExecutionPlan(shrinks=[ShrinkOp(P_INF, [1])])


def c3_granted_and_removed(reg, al, idle):
    return ExecutionPlan(signals=[SignalOp(P_TRN, [2, 3], Priority.INITIALIZATION)], clusters_to_remove={P_TRN})


def c3_expanded_and_removed(reg, al, idle):
    return ExecutionPlan(expands=[ExpandOp(Q_INF, {1: [6, 7]}, False, 2)], clusters_to_remove={Q_INF})


def c4_idle_overlaps_allocated_on_entry(reg, al, idle):
    idle.add(0)
    return valid_plan()


def c4_grant_of_non_idle_gpu(reg, al, idle):
    return ExecutionPlan(signals=[SignalOp(P_TRN, [0, 2], Priority.INITIALIZATION)])


def c4_expand_onto_non_idle_gpu(reg, al, idle):
    return ExecutionPlan(expands=[ExpandOp(P_INF, {2: [1]}, False, 1)])


def c5_shrink_inactive_rank(reg, al, idle):
    return ExecutionPlan(shrinks=[ShrinkOp(Q_INF, [1])])


def c5_expand_active_rank(reg, al, idle):
    return ExecutionPlan(expands=[ExpandOp(Q_INF, {0: [6, 7]}, False, 2)])


def c6_grant_outside_mapping(reg, al, idle):
    return ExecutionPlan(signals=[SignalOp(Q_TRN, [6], Priority.INITIALIZATION)])


def c6_expand_bundle_not_tp(reg, al, idle):
    return ExecutionPlan(expands=[ExpandOp(Q_INF, {1: [6]}, False, 2)])


def c6_gpu_twice_in_expand(reg, al, idle):
    return ExecutionPlan(expands=[ExpandOp(P_INF, {2: [2], 3: [2]}, False, 1)])


def c6_shrunk_rank_without_bundle(reg, al, idle):
    al[P_INF].dp_rank_to_gpus = {0: [0]}  # rank 1 active but unmapped
    return ExecutionPlan(shrinks=[ShrinkOp(P_INF, [1])])


def c7_rank_beyond_max_dp(reg, al, idle):
    return ExecutionPlan(expands=[ExpandOp(Q_INF, {2: [6, 7]}, False, 2)])  # Q max_dp_workers = 2


def c7_negative_rank(reg, al, idle):
    return ExecutionPlan(expands=[ExpandOp(Q_INF, {-1: [6, 7]}, False, 2)])


def c7_active_count_exceeds_max_dp(reg, al, idle):
    al[Q_INF].active_dp_ranks = {0, 7}  # corrupt extra active rank
    return ExecutionPlan(expands=[ExpandOp(Q_INF, {1: [6, 7]}, False, 2)])


def c8_universe_gpu_unaccounted(reg, al, idle):
    idle.discard(7)  # GPU 7 is mapped but neither idle nor allocated
    return ExecutionPlan()


def c8_shrink_frees_gpu_outside_universe(reg, al, idle):
    al[P_INF].dp_rank_to_gpus = {0: [0], 1: [9]}
    return ExecutionPlan(shrinks=[ShrinkOp(P_INF, [1])])


def c9_gpu_freed_twice(reg, al, idle):
    al[P_INF].dp_rank_to_gpus = {0: [0], 1: [0]}
    return ExecutionPlan(shrinks=[ShrinkOp(P_INF, [0, 1])])


def c10_rank_already_mapped(reg, al, idle):
    al[P_INF].dp_rank_to_gpus[2] = [2]  # inactive rank 2 still mapped
    return ExecutionPlan(expands=[ExpandOp(P_INF, {2: [2]}, False, 1)])


def c10_gpu_owned_by_two_clusters(reg, al, idle):
    al[Q_TRN] = ClusterAllocation(Q_TRN, [1], Priority.ACTOR_TRAINING)  # GPU 1 also held by P_INF
    return ExecutionPlan()


def c11_remove_unknown_cluster(reg, al, idle):
    return ExecutionPlan(clusters_to_remove={Q_TRN})


def c11_shrink_cluster_without_allocation(reg, al, idle):
    del al[Q_INF]
    idle.update({4, 5})
    return ExecutionPlan(shrinks=[ShrinkOp(Q_INF, [0])])


def c11_signal_unregistered_pipeline(reg, al, idle):
    return ExecutionPlan(signals=[SignalOp("Z_actor_train", [2], Priority.INITIALIZATION)])


def c11_expand_unregistered_pipeline(reg, al, idle):
    return ExecutionPlan(expands=[ExpandOp("Z_actor_infer", {0: [2]}, False, 1)])


CASES = [
    (1, c1_dup_shrink),
    (1, c1_dup_expand),
    (1, c1_dup_signal),
    (2, c2_shrink_non_gen_name),
    (2, c2_expand_non_gen_name),
    (2, c2_shrink_gen_cluster_allocated_at_init),
    (3, c3_granted_and_removed),
    (3, c3_expanded_and_removed),
    (4, c4_idle_overlaps_allocated_on_entry),
    (4, c4_grant_of_non_idle_gpu),
    (4, c4_expand_onto_non_idle_gpu),
    (5, c5_shrink_inactive_rank),
    (5, c5_expand_active_rank),
    (6, c6_grant_outside_mapping),
    (6, c6_expand_bundle_not_tp),
    (6, c6_gpu_twice_in_expand),
    (6, c6_shrunk_rank_without_bundle),
    (7, c7_rank_beyond_max_dp),
    (7, c7_negative_rank),
    (7, c7_active_count_exceeds_max_dp),
    (8, c8_universe_gpu_unaccounted),
    (8, c8_shrink_frees_gpu_outside_universe),
    (9, c9_gpu_freed_twice),
    (10, c10_rank_already_mapped),
    (10, c10_gpu_owned_by_two_clusters),
    (11, c11_remove_unknown_cluster),
    (11, c11_shrink_cluster_without_allocation),
    (11, c11_signal_unregistered_pipeline),
    (11, c11_expand_unregistered_pipeline),
]


@pytest.mark.parametrize("condition,make", CASES, ids=[f.__name__ for _, f in CASES])
def test_each_condition_is_reported_with_its_number(condition, make):
    registry, allocations, idle = baseline()
    plan = make(registry, allocations, idle)
    with pytest.raises(PlanValidationError) as info:
        run(plan, registry, allocations, idle)
    assert info.value.condition == condition, str(info.value)
    assert str(info.value).startswith(f"condition {condition}:")


def test_every_condition_1_to_11_has_a_case():
    assert sorted({c for c, _ in CASES}) == list(range(1, 12))


def test_condition_8_tolerates_unmapped_gpus_in_the_known_pool():
    # GPUs no pipeline maps but that sit in the idle pool are part of the universe.
    registry, allocations, idle = baseline()
    idle.add(8)
    run(valid_plan(), registry, allocations, idle)


def test_empty_shrink_op_is_ignored_in_simulation():
    registry, allocations, idle = baseline()
    run(ExecutionPlan(shrinks=[ShrinkOp(Q_INF, [])]), registry, allocations, idle)


def test_error_carries_context():
    registry, allocations, idle = baseline()
    with pytest.raises(PlanValidationError) as info:
        run(c5_shrink_inactive_rank(registry, allocations, idle), registry, allocations, idle)
    assert info.value.context["cluster_id"] == Q_INF
    assert info.value.context["active"] == [0]


# --------------------------------------------------------------------------- through the model


def _model_with_waiters():
    """A holds GEN ranks on [0,1]; then a training request and a planned release are pending."""
    m = SchedulerModel(ClusterTopology(1, 4))
    m.register("A", {"actor_infer": 1, "actor_train": 1}, {"actor_infer": [0, 1], "actor_train": [2, 3]})
    m.admit("A")
    m.request("A_actor_infer", Priority.GENERATION, step_target_estimate=10)
    m.run_cycle()
    assert m.snapshot()["allocations"]["A_actor_infer"]["active_dp_ranks"] == [0, 1]
    train = m.request("A_actor_train", Priority.ACTOR_TRAINING)
    release = m.await_release(cluster_id="A_actor_infer")
    assert not train.done and not release.done
    m.drain()
    return m, train.request_id, release.request_id


def _inject(monkeypatch, add_bogus):
    original = cycle_mod.gap_ratio_plan

    def faulty(plan, inp):
        result = original(plan, inp)
        add_bogus(plan)
        return result

    monkeypatch.setattr(cycle_mod, "gap_ratio_plan", faulty)


BOGUS = [
    (2, lambda plan: plan.expands.append(ExpandOp("A_actor_train", {0: [2]}, False, 1))),
    (1, lambda plan: plan.signals.append(plan.signals[0])),  # the training grant, twice
    (7, lambda plan: plan.expands.append(ExpandOp("A_actor_infer", {5: [0]}, False, 1))),
]


@pytest.mark.parametrize("condition,add_bogus", BOGUS, ids=["cond2", "cond1", "cond7"])
def test_validation_failure_in_run_cycle_fails_the_model(monkeypatch, condition, add_bogus):
    m, train_rid, release_rid = _model_with_waiters()
    before = m.snapshot()
    _inject(monkeypatch, add_bogus)

    assert m.run_cycle() == []

    recs = m.drain()
    kinds = [r["kind"] for r in recs]
    assert "validation_failed" in kinds and "scheduler_failed" in kinds
    assert "plan" not in kinds and "commit" not in kinds
    vf = next(r for r in recs if r["kind"] == "validation_failed")
    assert vf["condition"] == condition
    assert vf["cycle"] == 2
    assert kinds.index("validation_failed") < kinds.index("scheduler_failed")
    # Every waiter is errored: the pending training request and the planned release.
    errored = {r["request_id"]: r for r in recs if r["kind"] == "signalled"}
    assert set(errored) == {train_rid, release_rid}
    assert errored[train_rid]["waiter"] == "request"
    assert errored[release_rid]["waiter"] == "planned_release"
    for r in errored.values():
        assert r["error"].startswith("scheduler_loop_failed:")
        assert f"condition {condition}" in r["error"]
        assert r["gpus"] == []
    # Nothing was committed, no waiter remains.
    assert m.snapshot() == before
    assert not m.state.has_waiters()
    assert m.failed is not None and f"condition {condition}" in m.failed


def test_failed_model_rejects_every_later_input(monkeypatch):
    m, _, _ = _model_with_waiters()
    _inject(monkeypatch, BOGUS[0][1])
    m.run_cycle()
    m.drain()
    monkeypatch.undo()  # even with the fault removed, the model stays failed

    calls = [
        lambda: m.register("B", {"actor_infer": 1}, {"actor_infer": [3]}),
        lambda: m.admit("A"),
        lambda: m.request("A_actor_train", Priority.ACTOR_TRAINING),
        lambda: m.release("A_actor_infer"),
        lambda: m.await_release(cluster_id="A_actor_infer"),
        lambda: m.report_progress(ProgressReport("A", 10, 1.0)),
        lambda: m.clear_progress("A"),
        lambda: m.unregister("A"),
        lambda: m.plan_cycle(),
        lambda: m.run_cycle(),
    ]
    for call in calls:
        with pytest.raises(Rejected) as info:
            call()
        assert "failed fast" in info.value.reason
    assert m.drain() == []
    assert m.background_rebalance_reason() is None


# --------------------------------------------------------------------------- the union shortcut


def _perturb_none(reg, al, idle):
    return None


def _perturb_idle_overlap(reg, al, idle):
    idle.add(1)


def _perturb_gpu_unaccounted(reg, al, idle):
    idle.discard(6)


def _perturb_double_owner(reg, al, idle):
    al[Q_TRN] = ClusterAllocation(Q_TRN, [4], Priority.ACTOR_TRAINING)


def _perturb_gpu_twice_in_one_list(reg, al, idle):
    al[P_INF].gpu_ids.append(0)


def _perturb_unmapped_idle(reg, al, idle):
    idle.add(9)


def _perturb_no_universe(reg, al, idle):
    return set()


PERTURBATIONS = [
    _perturb_none,
    _perturb_idle_overlap,
    _perturb_gpu_unaccounted,
    _perturb_double_owner,
    _perturb_gpu_twice_in_one_list,
    _perturb_unmapped_idle,
    _perturb_no_universe,
]
PLANS = [make for _, make in CASES] + [
    lambda reg, al, idle: valid_plan(),
    lambda reg, al, idle: ExecutionPlan(),
    lambda reg, al, idle: ExecutionPlan(shrinks=[ShrinkOp(Q_INF, [])]),
    lambda reg, al, idle: ExecutionPlan(
        shrinks=[ShrinkOp(P_INF, [0, 1])], signals=[SignalOp(P_TRN, [0, 1, 2, 3], Priority.ACTOR_TRAINING, None, 1)]
    ),
]


def _outcome(make, perturb):
    registry, allocations, idle = baseline()
    plan = make(registry, allocations, idle)
    universe = perturb(registry, allocations, idle)
    try:
        run(plan, registry, allocations, idle, UNIVERSE if universe is None else universe)
    except PlanValidationError as e:
        return e.condition, str(e), e.context
    return "valid"


@pytest.mark.parametrize("perturb", PERTURBATIONS, ids=[f.__name__ for f in PERTURBATIONS])
def test_the_union_shortcut_decides_as_the_general_checks_do(monkeypatch, perturb):
    """validate_plan skips its per-condition accounting checks when one union shows that no
    GPU is counted twice; with the shortcut off (always "counted twice": the general checks
    run) every plan, valid or broken, on every perturbed state gets the same verdict,
    condition number, message and context."""
    import harness.scheduler.validation as validation

    fast = [_outcome(make, perturb) for make in PLANS]
    monkeypatch.setattr(validation, "_union_if_disjoint", lambda idle, gpu_lists, held: None)
    assert [_outcome(make, perturb) for make in PLANS] == fast
