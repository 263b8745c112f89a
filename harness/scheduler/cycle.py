"""One scheduling cycle's planning half: RLix Phases 0.5, 2, 3, 4 and 5-prep.

``plan_cycle`` reads the state and returns a :class:`CyclePlan`; it mutates nothing but
the plan (RLix plans under its lock and commits later, after the resize RPCs). Phase
numbers are RLix's (docs/modelled-systems.md#rlix-one-scheduling-cycle) so a reader can follow both side by side.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from harness.scheduler.options import SchedulerOptions
from harness.scheduler.planner import GapRatioInputs, GapRatioResult, gap_ratio_plan
from harness.scheduler.policies import GAP_RATIO, may_preempt, plan_generation
from harness.scheduler.state import SchedulerState
from harness.scheduler.types import (
    GENERATION_CLUSTER,
    ExecutionPlan,
    Priority,
    ShrinkOp,
    SignalOp,
    parse_cluster_id,
)
from harness.scheduler.validation import validate_plan


class CycleFailure(RuntimeError):
    """A cycle hit an error RLix treats as fatal (fail-fast shutdown of the scheduler)."""


@dataclass
class ResizeCall:
    """One coordinator ``resize_infer`` call: exactly one of the two lists is non-empty."""

    pipeline_id: str
    dp_ranks_to_remove: List[int]
    dp_ranks_to_add: List[int]


@dataclass
class CyclePlan:
    cycle: int
    reason: str
    plan: ExecutionPlan
    shrink_calls: List[ResizeCall] = field(default_factory=list)
    expand_calls: List[ResizeCall] = field(default_factory=list)
    shrunk_ranks: Dict[str, Set[int]] = field(default_factory=dict)  # for the planned-release fix
    gap: Optional[GapRatioResult] = None


def _merge_shrink(plan: ExecutionPlan, cluster_id: str, ranks) -> bool:
    """Append ranks to the cluster's shrink op; return False if the rank was already there."""
    op = plan.shrink_op(cluster_id)
    if op is None:
        plan.shrinks.append(ShrinkOp(cluster_id, list(ranks)))
        return True
    fresh = True
    for r in ranks:
        if r in op.dp_ranks_to_remove:
            fresh = False
        else:
            op.dp_ranks_to_remove.append(r)
    return fresh


def _phase_planned_releases(
    state: SchedulerState, plan: ExecutionPlan, available: Set[int], opts: SchedulerOptions
) -> None:
    for cid, req in list(state.planned_releases.items()):
        alloc = state.allocations.get(cid)
        if alloc is None:
            raise CycleFailure(f"await_release_gpus for unknown cluster_id {cid!r}")
        if alloc.priority != Priority.GENERATION:
            raise CycleFailure(f"await_release_gpus is only supported for GENERATION clusters, got {cid!r}")
        if not opts.ack_unplanned_releases:
            # fixed variant: shrink what is active now, not what was active at the call
            req.dp_ranks_to_remove = sorted(alloc.active_dp_ranks)
        if not req.dp_ranks_to_remove:
            continue  # acked at commit like every other planned release
        pid, _ = parse_cluster_id(cid)
        cfg = state.registry[pid].infer
        for r in req.dp_ranks_to_remove:
            available.update(alloc.dp_rank_to_gpus.get(r) or cfg.bundle(r))
        _merge_shrink(plan, cid, req.dp_ranks_to_remove)


_NON_GENERATION = tuple(Priority(p) for p in range(int(Priority.INITIALIZATION), int(Priority.GENERATION)))
_GENERATION = Priority.GENERATION  # the enum attribute lookup is slow enough to show up per cycle


def _phase_non_generation(
    state: SchedulerState, plan: ExecutionPlan, available: Set[int], reserved: Set[int], opts: SchedulerOptions
) -> None:
    targets: Set[str] = set()
    blocked = False
    for prio in _NON_GENERATION:
        bucket = state.pending[prio]
        if not bucket:
            continue
        for pending in list(reversed(bucket)) if opts.grant_newest_first else list(bucket):
            cid = pending.cluster_id
            if cid in targets:
                raise CycleFailure(f"Duplicate pending allocation planned for cluster_id={cid!r}")
            if cid in state.allocations:
                continue
            pid, name = parse_cluster_id(cid)
            entry = state.registry.get(pid)
            if entry is None or name not in entry.clusters:
                raise CycleFailure(f"Unknown cluster_id {cid!r}; register_pipeline must run first")
            if blocked:
                continue
            needed = set(entry.clusters[name].device_mapping)
            own = state.held_for.get(cid)
            if own:  # option reserve_same_cluster_release: its own released GPUs are open to it
                available |= own & state.idle_gpus
            missing = needed - available
            snapshot = None
            if missing and opts.rollback_ungrantable_preemption:
                snapshot = (copy.deepcopy(plan.shrinks), set(available))
            if missing:
                _preempt_generation(state, plan, available, missing, None if opts.policy == GAP_RATIO else (cid, opts))
            if needed <= available:
                available.difference_update(needed)
                reserved.update(needed)
                targets.add(cid)
                plan.signals.append(
                    SignalOp(cid, sorted(needed), prio, pending.lora_name, entry.clusters[name].tp_size)
                )
            else:
                if snapshot is not None:
                    plan.shrinks, restored = snapshot
                    available.clear()
                    available.update(restored)
                if own:
                    available.difference_update(own)
                if opts.head_of_line_blocking:
                    blocked = True


def _preempt_generation(
    state: SchedulerState,
    plan: ExecutionPlan,
    available: Set[int],
    missing: Set[int],
    policy: Optional[Tuple[str, SchedulerOptions]] = None,
) -> None:
    """Shrink GEN ranks holding missing GPUs (RLix Phase 2 donor scan, allocation order).
    ``policy`` (requester, options) when a policy other than gap_ratio may refuse a donor."""
    for donor_cid, donor in list(state.allocations.items()):
        if donor.priority != Priority.GENERATION or donor_cid in plan.clusters_to_remove:
            continue
        if policy is not None and not may_preempt(state, policy[1], donor_cid, policy[0]):
            continue
        if missing.isdisjoint(donor.gpu_ids):
            continue
        for r in sorted(donor.active_dp_ranks):
            bundle = set(donor.dp_rank_to_gpus.get(r) or ())
            if bundle.isdisjoint(missing):
                continue
            if _merge_shrink(plan, donor_cid, [r]):
                available.update(bundle)  # newly freed; a rank already shrunk is not counted twice
            missing.difference_update(bundle & available)
            if not missing:
                break
        if not missing:
            break


def _phase_generation(
    state: SchedulerState, plan: ExecutionPlan, available: Set[int], reserved: Set[int], opts: SchedulerOptions
) -> GapRatioResult:
    available.difference_update(reserved)
    shrinking: Dict[str, Set[int]] = {}
    for op in plan.shrinks:
        shrinking.setdefault(op.cluster_id, set()).update(op.dp_ranks_to_remove)
    pending_gen = state.pending[_GENERATION]
    for pending in pending_gen:
        pid, name = parse_cluster_id(pending.cluster_id)
        if name != GENERATION_CLUSTER or pid not in state.registry:
            continue
        alloc = state.allocations.get(pending.cluster_id)
        if alloc is None or alloc.priority != _GENERATION:
            continue
        if alloc.active_dp_ranks - shrinking.get(pending.cluster_id, set()):
            # Wake-only signal: at least one worker stays active (RLix e589866).
            plan.signals.append(SignalOp(pending.cluster_id, [], _GENERATION, None, 0))
    estimates: Dict[str, Optional[int]] = {}
    for p in pending_gen:
        estimates.setdefault(p.cluster_id, p.step_target_estimate)
    # fixed variant: a cluster waiting to reach zero is never expanded in the meantime
    frozen = set() if opts.ack_unplanned_releases else set(state.planned_releases)
    if opts.policy != GAP_RATIO:  # another policy's Phase 4 (harness/scheduler/policies.py)
        return plan_generation(state, plan, available, estimates, frozen, opts)
    # ``available`` and ``reserved`` are this cycle's own sets, not read after this call,
    # and the planner copies the idle set it mutates: they are handed over uncopied.
    # Positional (in GapRatioInputs' field order): this runs every cycle and keyword
    # passing of 13 fields costs more than the early-exit planner itself.
    return gap_ratio_plan(
        plan,
        GapRatioInputs(
            state.registry,  # registry
            state.allocations,  # allocations
            reserved,  # non_gen_reserved
            available,  # idle
            estimates,  # pending_gen
            state.progress.totals,  # progress_totals
            opts.epsilon,  # epsilon
            state.gpu_pipelines(),  # gpu_pipelines
            state.neighbours(),  # neighbours
            frozen,  # frozen
            state.gen_clusters(),  # gen_clusters
            opts.max_gap_iterations,  # max_iterations
            opts.max_gap_activations,  # max_activations
            opts.demand_floor,  # demand_floor
        ),
    )


def _resize_calls(plan: ExecutionPlan) -> Tuple[List[ResizeCall], List[ResizeCall], Dict[str, Set[int]]]:
    if not (plan.shrinks or plan.expands):
        return [], [], {}  # what the loops below produce for a plan with neither
    removes: Dict[str, Set[int]] = {}
    adds: Dict[str, Set[int]] = {}
    for op in plan.shrinks:
        pid, name = parse_cluster_id(op.cluster_id)
        if name == GENERATION_CLUSTER and op.dp_ranks_to_remove:
            removes.setdefault(pid, set()).update(op.dp_ranks_to_remove)
    for op in plan.expands:
        pid, name = parse_cluster_id(op.cluster_id)
        if name == GENERATION_CLUSTER and op.dp_rank_to_gpus:
            adds.setdefault(pid, set()).update(op.dp_rank_to_gpus)
    shrink_calls, expand_calls = [], []
    for pid in sorted(set(removes) | set(adds)):
        both = removes.get(pid, set()) & adds.get(pid, set())
        if both:
            raise CycleFailure(
                f"resize_infer dp_rank overlap in a single scheduling cycle: pipeline_id={pid!r} overlapping_dp_ranks={sorted(both)}"
            )
        if removes.get(pid):
            shrink_calls.append(ResizeCall(pid, sorted(removes[pid]), []))
        if adds.get(pid):
            expand_calls.append(ResizeCall(pid, [], sorted(adds[pid])))
    return shrink_calls, expand_calls, removes


def plan_cycle(state: SchedulerState, opts: SchedulerOptions, *, reason: str) -> CyclePlan:
    """Phases 0.5 → 5-prep. Raises PlanValidationError or CycleFailure (both fatal)."""
    state.cycle_counter += 1
    plan = ExecutionPlan()
    available = set(state.idle_gpus)
    if state.planned_releases:
        _phase_planned_releases(state, plan, available, opts)
    reserved: Set[int] = set()
    for alloc in state.allocations.values():
        if alloc.priority != _GENERATION:
            reserved.update(alloc.gpu_ids)
    if state.held_for:  # option reserve_same_cluster_release (empty unless it is on)
        for gpus in state.held_for.values():
            available.difference_update(gpus)
            reserved.update(gpus)
    _phase_non_generation(state, plan, available, reserved, opts)
    gap = _phase_generation(state, plan, available, reserved, opts)
    validate_plan(
        plan,
        registry=state.registry,
        allocations=state.allocations,
        idle_gpus=state.idle_gpus,
        universe=state.universe(),
    )
    shrink_calls, expand_calls, removes = _resize_calls(plan)
    return CyclePlan(
        state.cycle_counter, reason, plan, shrink_calls, expand_calls, {pid: set(r) for pid, r in removes.items()}, gap
    )
