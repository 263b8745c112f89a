"""One scheduling cycle's commit half: RLix Phase 6 (``_apply_plan_and_signal``).

Applies shrinks, grants and expands to the state, then signals waiters. Runs after the
resize calls returned, so a waiter is only ever signalled after its expand completed
(the T1 < T2 < T3 guarantee). Stale-plan rules (RLix bc7911e) are kept: an op for a
pipeline unregistered during the lock gap is skipped, unless a waiter for it is still
present, which is cleanup corruption and fatal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Set

from harness.scheduler.cycle import CycleFailure, CyclePlan
from harness.scheduler.options import SchedulerOptions
from harness.scheduler.state import SchedulerState
from harness.scheduler.types import (
    ClusterAllocation,
    ExecutionPlan,
    PendingRequest,
    Priority,
    build_dp_rank_mapping,
    is_generation_cluster,
    parse_cluster_id,
)


@dataclass
class Signal:
    """A blocked call returns: a request gets GPUs (or an error), a planned release is acked."""

    request_id: int
    kind: str  # "request" | "planned_release"
    cluster_id: str
    priority: Optional[Priority]
    gpus: List[int]
    cycle: Optional[int]
    error: Optional[str] = None
    shrink_executed: Optional[bool] = None  # planned releases: did this cycle shrink its ranks?


@dataclass
class CommitResult:
    signals: List[Signal]
    skipped_stale: List[str]


def _pop_pending(state: SchedulerState, cluster_id: str, priority: Priority) -> Optional[PendingRequest]:
    bucket = state.pending[priority]
    for i, p in enumerate(bucket):
        if p.cluster_id == cluster_id:
            return bucket.pop(i)
    return None


def _signal(
    state: SchedulerState, out: List[Signal], cycle: int, cluster_id: str, priority: Priority, gpus: List[int]
) -> None:
    pending = _pop_pending(state, cluster_id, priority)
    if pending is None:
        pid, _ = parse_cluster_id(cluster_id)
        if pid not in state.registry:
            return  # unregistered in the lock gap: its waiter was already errored (benign)
        raise CycleFailure(f"No pending request found for cluster_id={cluster_id!r} priority={priority.name}")
    out.append(Signal(pending.request_id, "request", cluster_id, priority, list(gpus), cycle))


def commit_cycle(state: SchedulerState, cp: CyclePlan, opts: SchedulerOptions) -> CommitResult:
    """Phase 6 in RLix's order: shrinks, removed clusters, grants (each signalled as it is
    applied), expands, then the expanded clusters' waiters, then planned releases."""
    plan, cycle = cp.plan, cp.cycle
    out: List[Signal] = []
    skipped: List[str] = []
    _apply_shrinks(state, plan)
    for cid in plan.clusters_to_remove:
        alloc = state.allocations.pop(cid, None)
        if alloc is not None:
            state.idle_gpus |= set(alloc.gpu_ids)
    _apply_grants(state, plan, cycle, out, skipped)
    to_signal = _apply_expands(state, plan, cycle, skipped)
    # RLix iterates a Python set here (hash order); sorted order keeps the model deterministic.
    for cid in sorted(to_signal):
        if state.pending_in(Priority.GENERATION, cid) is not None:
            _signal(state, out, cycle, cid, Priority.GENERATION, sorted(state.allocations[cid].gpu_ids))

    if state.planned_releases:  # rarely any: skip the snapshot copy below
        _ack_planned_releases(state, cp, opts, out)
    return CommitResult(out, skipped)


def _apply_shrinks(state: SchedulerState, plan: ExecutionPlan) -> None:
    """The shrunk dp ranks' GPUs go back to the idle pool."""
    for op in plan.shrinks:
        alloc = state.allocations.get(op.cluster_id)
        if alloc is None:
            continue
        pid, _ = parse_cluster_id(op.cluster_id)
        for r in op.dp_ranks_to_remove:
            bundle = set(alloc.dp_rank_to_gpus.get(r) or ())
            if not bundle and pid in state.registry:
                bundle = set(state.registry[pid].infer.bundle(r))
            alloc.active_dp_ranks.discard(r)
            alloc.dp_rank_to_gpus.pop(r, None)
            alloc.gpu_ids = [g for g in alloc.gpu_ids if g not in bundle]
            state.idle_gpus |= bundle


def _apply_grants(
    state: SchedulerState, plan: ExecutionPlan, cycle: int, out: List[Signal], skipped: List[str]
) -> None:
    """Whole-mapping grants (and the no-GPU signals of already-held clusters), each signalled
    as applied; a grant for a pipeline unregistered in the lock gap is skipped, unless its
    waiter is still there (cleanup corruption: fatal)."""
    for op in plan.signals:
        if not op.gpus:
            existing = state.allocations.get(op.cluster_id)
            gpus = (
                list(existing.gpu_ids)
                if existing is not None and existing.priority == op.priority and existing.gpu_ids
                else []
            )
            _signal(state, out, cycle, op.cluster_id, op.priority, gpus)
            continue
        pid, _ = parse_cluster_id(op.cluster_id)
        if pid not in state.registry:
            if state.pending_in(op.priority, op.cluster_id) is not None:
                raise CycleFailure(
                    f"Pipeline {pid!r} removed from registry but pending waiter still present for cluster_id={op.cluster_id!r} — cleanup corruption"
                )
            skipped.append(f"grant {op.cluster_id}")
            continue
        if state.pending_in(op.priority, op.cluster_id) is None:
            raise CycleFailure(
                f"Planned allocation has no pending waiter: cluster_id={op.cluster_id!r} priority={op.priority.name}"
            )
        gpus = sorted(op.gpus)
        mapping = build_dp_rank_mapping(gpus, op.tp_size)
        state.idle_gpus -= set(gpus)
        if state.held_for:
            state.held_for.pop(op.cluster_id, None)  # its reservation ends with the grant
        state.allocations[op.cluster_id] = ClusterAllocation(
            cluster_id=op.cluster_id,
            gpu_ids=gpus,
            priority=op.priority,
            active_dp_ranks=set(mapping) if is_generation_cluster(op.cluster_id) else set(),
            dp_rank_to_gpus=mapping,
            timestamp=float(cycle),
        )
        _signal(state, out, cycle, op.cluster_id, op.priority, gpus)


def _apply_expands(state: SchedulerState, plan: ExecutionPlan, cycle: int, skipped: List[str]) -> Set[str]:
    """Generation expands join their allocations; returns the clusters whose waiter is to be signalled."""
    to_signal: Set[str] = set()
    for op in plan.expands:
        if not op.dp_rank_to_gpus:
            continue
        pid, _ = parse_cluster_id(op.cluster_id)
        if pid not in state.registry:
            skipped.append(f"expand {op.cluster_id}")
            continue
        added = {g for b in op.dp_rank_to_gpus.values() for g in b}
        alloc = state.allocations.get(op.cluster_id)
        if alloc is None:
            state.allocations[op.cluster_id] = ClusterAllocation(
                cluster_id=op.cluster_id,
                gpu_ids=sorted(added),
                priority=Priority.GENERATION,
                active_dp_ranks=set(op.dp_rank_to_gpus),
                dp_rank_to_gpus={r: list(b) for r, b in op.dp_rank_to_gpus.items()},
                timestamp=float(cycle),
            )
        else:
            alloc.dp_rank_to_gpus.update({r: list(b) for r, b in op.dp_rank_to_gpus.items()})
            alloc.active_dp_ranks |= set(op.dp_rank_to_gpus)
            alloc.gpu_ids = sorted(set(alloc.gpu_ids) | added)
        state.idle_gpus -= added
        if op.has_pending_request:
            to_signal.add(op.cluster_id)
    return to_signal


def _ack_planned_releases(state: SchedulerState, cp: CyclePlan, opts: SchedulerOptions, out: List[Signal]) -> None:
    """Ack the planned releases (RLix acks every pending one; the fixed variant waits for zero)."""
    cycle = cp.cycle
    for cid, req in list(state.planned_releases.items()):
        pid, _ = parse_cluster_id(cid)
        executed = set(req.dp_ranks_to_remove) <= cp.shrunk_ranks.get(pid, set()) if req.dp_ranks_to_remove else True
        if not opts.ack_unplanned_releases:
            alloc = state.allocations.get(cid)
            if alloc is not None and alloc.active_dp_ranks:
                continue  # fixed variant: ack only once the cluster really is at zero
        del state.planned_releases[cid]
        out.append(
            Signal(req.request_id, "planned_release", cid, Priority.GENERATION, [], cycle, shrink_executed=executed)
        )
