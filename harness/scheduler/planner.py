"""Gap-ratio planner: how GENERATION GPUs are shared by remaining demand.

The decisions are RLix's exactly (reference/rlix.md §2.4, ``plan_generation_gap_ratio``):
the same targets, the same acceptor order, the same candidate score and donor order, the
same one-bundle-per-iteration loop and the same iteration bounds. What differs is cost.
RLix rescans every pipeline and every inactive rank on each activation, which is
quadratic in cluster size; here

* acceptors sit in a heap keyed by RLix's sort key and only pipelines whose active count
  changed are re-keyed, so one iteration costs O(log P) instead of O(P log P);
* each pipeline keeps a lazily built min-heap of "free" inactive ranks (bundle entirely
  idle), so the common case — the lowest free rank wins, since a candidate that needs no
  shrink always beats one that does — is found without scoring every rank;
* donors are found through a GPU → active-worker index instead of scanning every donor's
  workers for each candidate.

Anything that is not the common case falls back to scoring every candidate exactly as
RLix does. ``tests/unit/test_planner_equivalence.py`` pins the equivalence against a
direct transcription of the reference algorithm on random states.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple

from harness.scheduler.types import (
    ClusterAllocation,
    ClusterConfig,
    ExecutionPlan,
    ExpandOp,
    PipelineEntry,
    Priority,
    ShrinkOp,
    generation_cluster_id,
)

MAX_GAP_ITERATIONS = 10_000
MAX_GAP_ACTIVATIONS = 1_000


class PlannerLimitExceeded(RuntimeError):
    """RLix raises (and fails the whole system fast) when the loop exceeds its bounds."""


def round_half_up(value: float) -> int:
    return int(math.floor(value + 0.5))


@dataclass
class _PipelineState:
    index: int  # position in registry order: the stable tie-break RLix gets from sorted()
    pipeline_id: str
    cluster_id: str
    tp: int
    mapping: Tuple[int, ...]
    remaining: float
    percent_remaining: float
    eligible: bool  # RLix _receiver_eligible; static within one cycle
    commit_ok: bool  # RLix's re-check before committing (pending or allocation entry)
    has_pending: bool
    cfg: ClusterConfig
    active_set: Set[int]  # active ranks (snapshot minus shrinks, plus activations)
    donatable: List[int]  # snapshot-active ranks still active, ascending (donor order)
    blocked_inactive: int  # inactive ranks that are protected this cycle (shrunk or donated)
    target_ratio: float = 0.0
    target_gpu_count: int = 0
    gap: float = 0.0
    free_heap: Optional[List[int]] = None  # lazily built
    failed_at: int = -1  # iteration of the last slow-path failure (memo, see below)

    @property
    def active(self) -> int:
        return len(self.active_set)

    def inactive_sorted(self) -> List[int]:
        return [r for r in range(self.cfg.max_dp_workers) if r not in self.active_set]

    def has_available_inactive(self) -> bool:
        return self.cfg.max_dp_workers - len(self.active_set) - self.blocked_inactive > 0

    def owned(self) -> Set[int]:
        return {g for r in self.active_set for g in self.bundle(r)}

    def bundle(self, rank: int) -> Tuple[int, ...]:
        return self.mapping[rank * self.tp : (rank + 1) * self.tp]


@dataclass
class GapRatioInputs:
    registry: Mapping[str, PipelineEntry]
    allocations: Mapping[str, ClusterAllocation]
    non_gen_reserved: Set[int]
    idle: Set[int]  # GPUs available to GENERATION (planned idle minus non-GEN reserved)
    pending_gen: Mapping[str, Optional[int]]  # cluster_id -> step_target_estimate of its pending GEN request
    progress_totals: Callable[[str], Tuple[float, float]]
    epsilon: float = 0.0
    gpu_pipelines: Optional[Mapping[int, List[str]]] = None  # GPU -> pipelines mapping it (registry order)
    neighbours: Optional[Mapping[str, Set[str]]] = None  # pipeline -> pipelines sharing an infer GPU
    frozen: Set[str] = field(default_factory=set)  # clusters that may not receive (not RLix: a fixed variant)
    max_iterations: int = MAX_GAP_ITERATIONS
    max_activations: int = MAX_GAP_ACTIVATIONS


@dataclass
class GapRatioResult:
    idle: Set[int]
    activations: int = 0
    iterations: int = 0
    targets: Dict[str, int] = field(default_factory=dict)


def _pending_estimate(est: Optional[int]) -> Optional[float]:
    if est is None:
        return None
    val = int(est)
    return float(val) if val > 0 else None


def gap_ratio_plan(plan: ExecutionPlan, inp: GapRatioInputs) -> GapRatioResult:
    """Add GENERATION shrink/expand ops to ``plan``; return the GPUs left idle."""
    eps = inp.epsilon
    removed_by_plan: Dict[str, Set[int]] = {}
    for op in plan.shrinks:
        removed_by_plan.setdefault(op.cluster_id, set()).update(op.dp_ranks_to_remove)
    protected: Set[Tuple[str, int]] = set()
    for cid, ranks in removed_by_plan.items():
        if cid.endswith("_actor_infer"):
            pid = cid[: -len("_actor_infer")]
            protected.update((pid, r) for r in ranks)

    states: List[_PipelineState] = []
    for pid, entry in inp.registry.items():
        cfg = entry.infer
        cid = generation_cluster_id(pid)
        has_pending = cid in inp.pending_gen
        remaining, step_target = inp.progress_totals(pid)
        if step_target <= 0.0:
            est = _pending_estimate(inp.pending_gen.get(cid)) if has_pending else None
            if est is None:
                continue  # no reports and no estimate: RLix skips the pipeline entirely
            remaining = step_target = est
            percent = 1.0
        else:
            percent = remaining / step_target
        if has_pending:
            remaining += step_target  # demand inflation for a pipeline waiting to start
            percent = remaining / step_target
        alloc = inp.allocations.get(cid)
        current = set(alloc.active_dp_ranks) if alloc is not None and alloc.priority == Priority.GENERATION else set()
        current -= removed_by_plan.get(cid, set())
        in_allocs = cid in inp.allocations
        eligible = cid not in plan.clusters_to_remove and cid not in inp.frozen and (has_pending or bool(current) or in_allocs)
        states.append(_PipelineState(
            index=len(states), pipeline_id=pid, cluster_id=cid, tp=cfg.tp_size, mapping=cfg.device_mapping,
            remaining=remaining, percent_remaining=percent, eligible=eligible,
            commit_ok=cid not in plan.clusters_to_remove and cid not in inp.frozen and (has_pending or in_allocs),
            has_pending=has_pending, cfg=cfg, active_set=current, donatable=sorted(current),
            blocked_inactive=len(removed_by_plan.get(cid, ())),
        ))

    idle = set(inp.idle)
    if not idle.isdisjoint(inp.non_gen_reserved):
        raise RuntimeError("idle GPUs given to the planner overlap non-GEN reserved GPUs")
    result = GapRatioResult(idle=idle)
    total_weight = sum(s.remaining * s.tp for s in states if s.eligible)
    budget_gpus = len(idle) + sum(s.active * s.tp for s in states)
    if budget_gpus == 0:
        return result
    for s in states:
        if s.eligible and total_weight != 0:
            s.target_ratio = (s.remaining * s.tp) / total_weight
            s.target_gpu_count = max(round_half_up((s.target_ratio * budget_gpus) / s.tp) * s.tp, s.tp)
        result.targets[s.pipeline_id] = s.target_gpu_count
    reserved = inp.non_gen_reserved

    def refresh_gap(s: _PipelineState) -> None:
        s.gap = s.target_ratio - (s.active * s.tp) / budget_gpus

    def shrink_budget(s: _PipelineState) -> int:
        floor = max(1, s.target_gpu_count // s.tp) if (s.eligible and s.target_gpu_count > 0) else 0
        return max(0, s.active - floor)

    def acceptor_key(s: _PipelineState):
        if not (s.gap > eps and s.eligible and s.active * s.tp < s.target_gpu_count and s.target_ratio > 0):
            return None
        return (-(s.gap / s.target_ratio), -s.gap, s.pipeline_id)

    # GPU -> pipelines whose actor_infer mapping holds it, in registry order. The model
    # caches it across cycles (it changes only with the registry); built here otherwise.
    gpu_pipelines = inp.gpu_pipelines
    if gpu_pipelines is None:
        gpu_pipelines = {}
        for pid, entry in inp.registry.items():
            for g in entry.infer.device_mapping:
                gpu_pipelines.setdefault(g, []).append(pid)
    by_id = {s.pipeline_id: s for s in states}
    donatable_sets = {s.pipeline_id: set(s.donatable) for s in states}

    def owner(g: int) -> Optional[Tuple[_PipelineState, int]]:
        """The still-donatable worker holding GPU g, if any (ownership is unique)."""
        for pid in gpu_pipelines.get(g, ()):
            st = by_id.get(pid)
            if st is not None:
                r = st.cfg.rank_of_gpu[g]
                if r in donatable_sets[pid]:
                    return st, r
        return None

    neighbour_cache: Dict[str, Set[str]] = dict(inp.neighbours) if inp.neighbours is not None else {}

    def neighbours(s: _PipelineState) -> Set[str]:
        """Pipelines whose actor_infer mapping shares a GPU with s's."""
        got = neighbour_cache.get(s.pipeline_id)
        if got is None:
            got = {pid for g in s.mapping for pid in gpu_pipelines.get(g, ())}
            neighbour_cache[s.pipeline_id] = got
        return got

    def ranks_holding(g: int) -> List[Tuple[_PipelineState, int]]:
        return [(by_id[pid], by_id[pid].cfg.rank_of_gpu[g]) for pid in gpu_pipelines.get(g, ()) if pid in by_id]

    def is_free(s: _PipelineState, r: int) -> bool:
        if r in s.active_set or (s.pipeline_id, r) in protected:
            return False
        b = s.bundle(r)
        return all(g in idle for g in b) and not any(g in reserved for g in b)

    def lowest_free(s: _PipelineState) -> Optional[int]:
        if s.free_heap is None:
            # only ranks with a GPU in the idle set can be free: look them up from idle
            if len(idle) < s.cfg.max_dp_workers:
                rank_of = s.cfg.rank_of_gpu
                near = sorted({rank_of[g] for g in idle if g in rank_of})
            else:
                near = s.inactive_sorted()
            s.free_heap = [r for r in near if is_free(s, r)]
        heap = s.free_heap
        while heap:
            if is_free(s, heap[0]):
                return heap[0]
            heapq.heappop(heap)
        return None

    def score_candidates(s: _PipelineState, shrink_budget_of: Callable[[_PipelineState], int]):
        """RLix's full candidate scoring; only reached when no free rank exists."""
        best = None
        for r in s.inactive_sorted():
            if (s.pipeline_id, r) in protected:
                continue
            b = s.bundle(r)
            if any(g in reserved for g in b):
                continue
            missing = {g for g in b if g not in idle}
            picked: List[Tuple[_PipelineState, int]] = []
            if missing:
                donors = {}
                for g in missing:
                    o = owner(g)
                    if o is None:
                        continue
                    ds, dr = o
                    if ds.gap >= -eps or shrink_budget_of(ds) <= 0 or (ds.pipeline_id, dr) in protected:
                        continue
                    donors[(ds.pipeline_id, dr)] = o
                ordered = sorted(donors.values(), key=lambda o: (o[0].gap, o[0].index, o[1]))
                used: Dict[str, int] = {}
                for ds, dr in ordered:
                    if not missing:
                        break
                    if used.get(ds.pipeline_id, 0) >= shrink_budget_of(ds):
                        continue
                    picked.append((ds, dr))
                    used[ds.pipeline_id] = used.get(ds.pipeline_id, 0) + 1
                    missing.difference_update(ds.bundle(dr))
                if missing:
                    continue
            percents = sorted(ds.percent_remaining for ds, _ in picked)
            score = (1 if picked else 0, tuple(-p for p in percents), r)
            if best is None or score < best[0]:
                best = (score, r, picked)
        return best

    def activate(s: _PipelineState, rank: int, picked: List[Tuple[_PipelineState, int]]) -> None:
        bundle = s.bundle(rank)
        freed: Set[int] = set()
        for ds, dr in picked:
            op = plan.shrink_op(ds.cluster_id)
            if op is None:
                plan.shrinks.append(ShrinkOp(ds.cluster_id, [dr]))
            elif dr not in op.dp_ranks_to_remove:
                op.dp_ranks_to_remove.append(dr)
            ds.donatable.remove(dr)
            donatable_sets[ds.pipeline_id].discard(dr)
            ds.active_set.discard(dr)
            ds.blocked_inactive += 1
            protected.add((ds.pipeline_id, dr))
            freed.update(ds.bundle(dr))
        expand = next((op for op in plan.expands if op.cluster_id == s.cluster_id), None)
        if expand is None:
            plan.expands.append(ExpandOp(s.cluster_id, {rank: sorted(bundle)}, s.has_pending, s.tp))
        else:
            expand.dp_rank_to_gpus[rank] = sorted(bundle)
            expand.has_pending_request = expand.has_pending_request or s.has_pending
        s.active_set.add(rank)
        protected.add((s.pipeline_id, rank))
        leftovers = freed.difference(bundle)
        idle.difference_update(bundle)
        if leftovers:
            idle.update(leftovers)
            for g in leftovers:
                for qs, qr in ranks_holding(g):
                    if qs.free_heap is not None and is_free(qs, qr):
                        heapq.heappush(qs.free_heap, qr)

    for s in states:
        refresh_gap(s)
    heap: List[Tuple[tuple, int, int]] = []
    version = {s.pipeline_id: 0 for s in states}

    def push(s: _PipelineState) -> None:
        version[s.pipeline_id] += 1
        key = acceptor_key(s)
        if key is not None:
            heapq.heappush(heap, (key, s.index, version[s.pipeline_id]))

    for s in states:
        push(s)

    # A slow-path failure of acceptor X stays a failure until something it depends on
    # changes: X itself, a GPU of X's mapping turning idle, or a pipeline owning GPUs of
    # X's mapping changing its gap or budget (a receiver or a donor). ``dirty`` collects
    # those GPUs per iteration; a memoized failure is reused while none touch X's mapping.
    dirty_since: List[Set[int]] = []  # dirty_since[i] = GPUs changed after iteration i+1

    def still_failed(s: _PipelineState, iteration: int) -> bool:
        if s.failed_at < 0:
            return False
        for changed in dirty_since[s.failed_at - 1: iteration - 1]:
            if not s.cfg.mapping_set.isdisjoint(changed):
                return False
        return True

    iterations = activations = 0
    while True:
        iterations += 1
        if iterations > inp.max_iterations or activations > inp.max_activations:
            raise PlannerLimitExceeded(
                f"gap-ratio planning exceeded its bounds ({inp.max_iterations} iterations / {inp.max_activations} activations)")
        tried: List[Tuple[tuple, int, int]] = []
        winner = None
        donor_pids: Optional[Set[str]] = None  # pipelines able to donate now; computed on the first slow path
        while heap:
            entry = heapq.heappop(heap)
            _key, idx, ver = entry
            s = states[idx]
            if version[s.pipeline_id] != ver:
                continue  # stale key
            tried.append(entry)
            if not s.has_available_inactive():
                continue
            rank = lowest_free(s)
            if rank is not None:
                picked: List[Tuple[_PipelineState, int]] = []
            else:
                if donor_pids is None:
                    donor_pids = {ds.pipeline_id for ds in states if ds.gap < -eps and shrink_budget(ds) > 0}
                # No donor shares a GPU with this acceptor: every candidate needing a shrink fails.
                if donor_pids.isdisjoint(neighbours(s)) or still_failed(s, iterations):
                    continue
                best = score_candidates(s, shrink_budget)
                if best is None:
                    s.failed_at = iterations
                    continue
                _score, rank, picked = best
            if not s.commit_ok:
                continue
            winner = (s, rank, picked)
            break
        for entry in tried:
            heapq.heappush(heap, entry)
        if winner is None:
            break
        s, rank, picked = winner
        activate(s, rank, picked)
        activations += 1
        changed = {s.pipeline_id: s}
        for ds, _ in picked:
            changed[ds.pipeline_id] = ds
        # GPUs whose owner, idleness or protection changed, plus every GPU of a pipeline
        # whose gap/budget changed (donated bundles include any idle leftovers).
        dirty: Set[int] = set(s.bundle(rank))
        for ds, dr in picked:
            dirty.update(ds.bundle(dr))
        for c in changed.values():
            dirty |= c.owned()
            refresh_gap(c)
            push(c)
        dirty_since.append(dirty)
    result.idle = idle
    result.activations = activations
    result.iterations = iterations
    return result
