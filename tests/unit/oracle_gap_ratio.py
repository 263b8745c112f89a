"""A slow, literal oracle for RLix's gap-ratio GENERATION planner.

A transcription of RLix's ``plan_generation_gap_ratio`` (rlops/rlix,
``rlix/scheduler/planner.py`` at f77d913, branch nemo), written from the algorithm as
documented in docs/modelled-systems.md#rlix-gap-ratio-planner and checked against a reading
of that function. :func:`oracle_gap_ratio` is kept in one piece, longer than the
project's ~80-line rule on purpose, so that it can be read step by step beside the
upstream function (its phases in upstream's order, under the names of the documented
algorithm rather than upstream's). It is deliberately without any of the
production planner's shortcuts: every iteration recomputes every gap and every shrink
budget, re-sorts every acceptor, and scores every available inactive rank of an
acceptor from scratch. It exists only so ``test_planner_equivalence`` can compare
``harness.scheduler.planner.gap_ratio_plan`` against it on random states.

Inputs mirror ``GapRatioInputs`` so both planners are fed from one generated state; the
oracle appends to the same ``ExecutionPlan`` types and returns the GPUs left idle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple

from harness.scheduler.types import (
    ClusterAllocation,
    ExecutionPlan,
    ExpandOp,
    PipelineEntry,
    Priority,
    ShrinkOp,
)


class OracleLimitExceeded(RuntimeError):
    pass


@dataclass
class _Worker:
    pipeline_id: str
    dp_rank: int
    gpus: Tuple[int, ...]


@dataclass
class _Pipe:
    pipeline_id: str
    cluster_id: str
    tp: int
    remaining: float
    percent_remaining: float
    active: List[_Worker]  # list order matters: donors are walked in this order
    inactive: List[_Worker]
    target_ratio: float = 0.0
    target_gpus: int = 0
    gap: float = 0.0


def _half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def _bundle(mapping: Tuple[int, ...], tp: int, rank: int) -> Tuple[int, ...]:
    return tuple(mapping[rank * tp : (rank + 1) * tp])


def oracle_gap_ratio(
    plan: ExecutionPlan,
    *,
    registry: Mapping[str, PipelineEntry],
    allocations: Mapping[str, ClusterAllocation],
    non_gen_reserved: Set[int],
    idle: Set[int],
    pending_gen: Mapping[str, Optional[int]],
    progress_totals: Callable[[str], Tuple[float, float]],
    epsilon: float = 0.0,
    max_iterations: int = 10_000,
    max_activations: int = 1_000,
) -> Set[int]:
    idle = set(idle)
    reserved = set(non_gen_reserved)

    # ---- snapshot: ranks already in a shrink op of the plan count as inactive ----
    shrinking: Dict[str, Set[int]] = {}
    for op in plan.shrinks:
        if op.cluster_id.endswith("_actor_infer"):
            shrinking.setdefault(op.cluster_id, set()).update(op.dp_ranks_to_remove)

    protected: Set[Tuple[str, int]] = set()
    for op in plan.shrinks:
        if op.cluster_id.endswith("_actor_infer"):
            pid = op.cluster_id[: -len("_actor_infer")]
            for r in op.dp_ranks_to_remove:
                protected.add((pid, r))

    def has_pending(cid: str) -> bool:
        return cid in pending_gen

    def estimate_of(cid: str) -> Optional[float]:
        if cid not in pending_gen:
            return None
        est = pending_gen[cid]
        if est is None or int(est) <= 0:
            return None
        return float(int(est))

    pipes: List[_Pipe] = []
    for pid, entry in registry.items():
        cfg = entry.infer
        cid = f"{pid}_actor_infer"
        mapping = tuple(cfg.device_mapping)
        tp = cfg.tp_size
        max_dp = len(mapping) // tp

        alloc = allocations.get(cid)
        live: Set[int] = set()
        if alloc is not None and alloc.priority == Priority.GENERATION:
            live = set(alloc.active_dp_ranks)
        live -= shrinking.get(cid, set())

        remaining, step_target = progress_totals(pid)
        if step_target <= 0.0:
            est = estimate_of(cid)
            if est is None:
                continue  # no reports, no estimate: skipped completely
            remaining = est
            step_target = est
            percent = 1.0
        else:
            percent = remaining / step_target
        if has_pending(cid):
            remaining = remaining + step_target
            percent = remaining / step_target

        active = [_Worker(pid, r, _bundle(mapping, tp, r)) for r in sorted(live)]
        inactive = [_Worker(pid, r, _bundle(mapping, tp, r)) for r in range(max_dp) if r not in live]
        pipes.append(_Pipe(pid, cid, tp, remaining, percent, active, inactive))

    if idle & reserved:
        raise RuntimeError("idle overlaps reserved")

    def eligible(p: _Pipe) -> bool:
        if p.cluster_id in plan.clusters_to_remove:
            return False
        if has_pending(p.cluster_id):
            return True
        return len(p.active) > 0 or p.cluster_id in allocations

    weight = 0.0
    for p in pipes:
        if eligible(p):
            weight += p.remaining * p.tp
    budget = len(idle)
    for p in pipes:
        budget += len(p.active) * p.tp
    if budget == 0:
        return idle

    for p in pipes:
        if eligible(p) and weight != 0:
            p.target_ratio = (p.remaining * p.tp) / weight
            p.target_gpus = max(_half_up((p.target_ratio * budget) / p.tp) * p.tp, p.tp)
        else:
            p.target_ratio = 0.0
            p.target_gpus = 0

    def add_shrink(cid: str, rank: int) -> None:
        for op in plan.shrinks:
            if op.cluster_id == cid:
                if rank not in op.dp_ranks_to_remove:
                    op.dp_ranks_to_remove.append(rank)
                return
        plan.shrinks.append(ShrinkOp(cid, [rank]))

    by_id = {p.pipeline_id: p for p in pipes}
    iterations = 0
    activations = 0
    while True:
        iterations += 1
        if iterations > max_iterations or activations > max_activations:
            raise OracleLimitExceeded("bounds")

        # all gaps, all budgets, all percents: recomputed from scratch
        for p in pipes:
            p.gap = p.target_ratio - (len(p.active) * p.tp) / budget
        budgets: Dict[str, int] = {}
        for p in pipes:
            keep = max(1, p.target_gpus // p.tp) if (eligible(p) and p.target_gpus > 0) else 0
            budgets[p.pipeline_id] = max(0, len(p.active) - keep)
        percents = {p.pipeline_id: p.percent_remaining for p in pipes}

        acceptors = []
        for p in pipes:
            if not (p.gap > epsilon and eligible(p) and len(p.active) * p.tp < p.target_gpus):
                continue
            if p.target_ratio <= 0:
                continue
            acceptors.append(p)
        acceptors.sort(key=lambda p: (-(p.gap / p.target_ratio), -p.gap, p.pipeline_id))
        if not acceptors:
            break

        done = False
        for acc in acceptors:
            if acc.cluster_id in plan.clusters_to_remove:
                continue
            avail = [w for w in acc.inactive if (acc.pipeline_id, w.dp_rank) not in protected]
            if not avail:
                continue
            scored = []
            for cand in sorted(avail, key=lambda w: w.dp_rank):
                need = set(cand.gpus)
                if need & reserved:
                    continue
                missing = need - idle
                chosen: List[_Worker] = []
                if missing:
                    donor_workers: List[_Worker] = []
                    for dp in sorted(pipes, key=lambda q: q.gap):  # stable: registry order on ties
                        if dp.gap >= -epsilon:
                            continue
                        if budgets[dp.pipeline_id] <= 0:
                            continue
                        for w in dp.active:
                            if (w.pipeline_id, w.dp_rank) in protected:
                                continue
                            if not (set(w.gpus) & missing):
                                continue
                            donor_workers.append(w)
                    used: Dict[str, int] = {}
                    for w in donor_workers:
                        if not missing:
                            break
                        if used.get(w.pipeline_id, 0) >= budgets[w.pipeline_id]:
                            continue
                        chosen.append(w)
                        used[w.pipeline_id] = used.get(w.pipeline_id, 0) + 1
                        missing = missing - set(w.gpus)
                    if missing:
                        continue
                donor_pcts = sorted(percents[w.pipeline_id] for w in chosen)
                score = (1 if chosen else 0, tuple(-x for x in donor_pcts), cand.dp_rank)
                scored.append((score, cand, chosen))
            if not scored:
                continue
            scored.sort(key=lambda t: t[0])
            _, cand, chosen = scored[0]
            need = set(cand.gpus)
            if need & reserved:
                continue
            pool = set(idle)
            for w in chosen:
                pool |= set(w.gpus)
            if not need <= pool:
                continue
            # re-check before any mutation
            if acc.cluster_id in plan.clusters_to_remove:
                continue
            if not has_pending(acc.cluster_id) and acc.cluster_id not in allocations:
                continue
            for w in chosen:
                add_shrink(f"{w.pipeline_id}_actor_infer", w.dp_rank)
                donor = by_id[w.pipeline_id]
                donor.active = [x for x in donor.active if x.dp_rank != w.dp_rank]
                donor.inactive.append(w)
                protected.add((w.pipeline_id, w.dp_rank))
            op = next((o for o in plan.expands if o.cluster_id == acc.cluster_id), None)
            if op is None:
                plan.expands.append(
                    ExpandOp(acc.cluster_id, {cand.dp_rank: sorted(need)}, has_pending(acc.cluster_id), acc.tp)
                )
            else:
                op.dp_rank_to_gpus[cand.dp_rank] = sorted(need)
                op.has_pending_request = op.has_pending_request or has_pending(acc.cluster_id)
            acc.active.append(cand)
            acc.inactive = [x for x in acc.inactive if x.dp_rank != cand.dp_rank]
            protected.add((acc.pipeline_id, cand.dp_rank))
            activations += 1
            idle = pool - need
            done = True
            break
        if not done:
            break
    return idle
