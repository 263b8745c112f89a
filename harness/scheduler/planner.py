"""Gap-ratio planner: how GENERATION GPUs are shared by remaining demand.

The decisions are RLix's exactly (docs/modelled-systems.md#rlix-gap-ratio-planner, ``plan_generation_gap_ratio``):
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
* most calls add nothing: pipelines are first read into plain rows
  (``harness.scheduler.demand``) and the loop's state is only built when no early exit
  can prove that the loop would end at once with no op.

Anything that is not the common case falls back to scoring every candidate exactly as
RLix does. ``tests/unit/test_planner_equivalence.py`` pins the equivalence against a
direct transcription of the reference algorithm on random states.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from harness.ordered_sum import ordered_sum
from harness.scheduler.demand import demand_rows, gpu_pipeline_index, no_first_winner
from harness.scheduler.types import (
    ClusterAllocation,
    ClusterConfig,
    ExecutionPlan,
    ExpandOp,
    PipelineEntry,
    ShrinkOp,
)

MAX_GAP_ITERATIONS = 10_000
MAX_GAP_ACTIVATIONS = 1_000


class PlannerLimitExceeded(RuntimeError):
    """RLix raises (and fails the whole system fast) when the loop exceeds its bounds."""


class _PipelineState:
    """One pipeline as one planner call sees it (rebuilt every call, so a slots class)."""

    __slots__ = (
        "index",
        "pipeline_id",
        "cluster_id",
        "tp",
        "mapping",
        "remaining",
        "percent_remaining",
        "eligible",
        "commit_ok",
        "has_pending",
        "cfg",
        "active_set",
        "donatable",
        "blocked_inactive",
        "max_dp",
        "target_ratio",
        "target_gpu_count",
        "gap",
        "free_heap",
        "failed_at",
        "version",
    )

    def __init__(
        self,
        index: int,
        pipeline_id: str,
        cluster_id: str,
        cfg: ClusterConfig,
        remaining: float,
        percent_remaining: float,
        eligible: bool,
        commit_ok: bool,
        has_pending: bool,
        active_set: Set[int],
        blocked_inactive: int,
    ) -> None:
        self.index = index  # position in registry order: the stable tie-break RLix gets from sorted()
        self.pipeline_id = pipeline_id
        self.cluster_id = cluster_id
        self.cfg = cfg
        self.tp = cfg.tp_size
        self.mapping = cfg.device_mapping
        self.max_dp = cfg.max_dp_workers
        self.remaining = remaining
        self.percent_remaining = percent_remaining
        self.eligible = eligible  # RLix _receiver_eligible; static within one cycle
        self.commit_ok = commit_ok  # RLix's re-check before committing (pending or allocation entry)
        self.has_pending = has_pending
        self.active_set = active_set  # active ranks (snapshot minus shrinks, plus activations)
        # snapshot-active ranks still active (donor candidates); set once the loop is reached
        self.donatable: Set[int] = set()
        self.blocked_inactive = blocked_inactive  # inactive ranks protected this cycle (shrunk or donated)
        self.target_ratio = 0.0
        self.target_gpu_count = 0
        self.gap = 0.0
        self.free_heap: Optional[List[int]] = None  # lazily built
        self.failed_at = -1  # iteration of the last slow-path failure (memo, see below)
        self.version = 0  # bumped on every re-key; older heap entries are stale

    @property
    def active(self) -> int:
        return len(self.active_set)

    def inactive_sorted(self) -> List[int]:
        return [r for r in range(self.max_dp) if r not in self.active_set]

    def has_available_inactive(self) -> bool:
        return self.max_dp - len(self.active_set) - self.blocked_inactive > 0

    def owned(self) -> Set[int]:
        out: Set[int] = set()
        mapping, tp = self.mapping, self.tp
        for r in self.active_set:
            out.update(mapping[r * tp : (r + 1) * tp])
        return out

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
    # (pipeline id, its actor_infer cluster id, that cluster's config) in registry order;
    # the model caches it across cycles (it changes only with the registry), built here otherwise
    gen_clusters: Optional[Sequence[Tuple[str, str, ClusterConfig]]] = None
    max_iterations: int = MAX_GAP_ITERATIONS
    max_activations: int = MAX_GAP_ACTIVATIONS
    # MILES line (rlops/rlix PR #12, d455b0c): a cluster in ``allocations`` with no progress
    # and no pending estimate gets a floor demand instead of being skipped (docs/rlix-variants.md)
    demand_floor: bool = False


@dataclass
class GapRatioResult:
    idle: Set[int]
    activations: int = 0
    iterations: int = 0
    targets: Dict[str, int] = field(default_factory=dict)


def _check_bounds(inp: GapRatioInputs, iterations: int, activations: int) -> None:
    if iterations > inp.max_iterations or activations > inp.max_activations:
        raise PlannerLimitExceeded(
            f"gap-ratio planning exceeded its bounds ({inp.max_iterations} iterations / {inp.max_activations} activations)"
        )


def _pipeline_states(rows, fractions) -> List[_PipelineState]:
    """The mutable per-pipeline state of the activation loop, for the cycles that reach it."""
    states: List[_PipelineState] = []
    for (pid, cid, cfg, remaining, percent, eligible, commit_ok, has_pending, active, removed, _n), (
        ratio,
        count,
        gap,
    ) in zip(rows, fractions):
        current = set(active)
        if removed:
            current -= removed
        s = _PipelineState(
            len(states),
            pid,
            cid,
            cfg,
            remaining,
            percent,
            eligible,
            commit_ok,
            has_pending,
            current,
            len(removed) if removed else 0,
        )
        s.target_ratio, s.target_gpu_count, s.gap = ratio, count, gap
        s.donatable = set(current)  # no activation yet: active_set is still the snapshot
        states.append(s)
    return states


def gap_ratio_plan(plan: ExecutionPlan, inp: GapRatioInputs) -> GapRatioResult:
    """Add GENERATION shrink/expand ops to ``plan``; return the GPUs left idle.

    A transcription of RLix's ``plan_generation_gap_ratio`` (rlops/rlix,
    ``rlix/scheduler/planner.py`` at f77d913, branch nemo; the MILES demand floor of
    ``demand_floor`` at d455b0c): the same targets, acceptor order, candidate scores, donor
    order, one-bundle-per-iteration loop and bounds, with the data structures of the module
    docstring in place of upstream's rescans. It is kept in one function, with its helpers
    nested as upstream nests its own, so that it can be read step by step beside the
    upstream function; being longer than the project's ~80-line rule is deliberate.
    ``tests/unit/oracle_gap_ratio.py`` is the literal, unoptimized transcription that
    ``tests/unit/test_planner_equivalence.py`` compares it with on random states."""
    eps = inp.epsilon
    removed_by_plan: Dict[str, Set[int]] = {}
    for op in plan.shrinks:
        removed_by_plan.setdefault(op.cluster_id, set()).update(op.dp_ranks_to_remove)
    rows, weights, active_gpus = demand_rows(plan, inp, removed_by_plan)

    idle = inp.idle
    if not idle.isdisjoint(inp.non_gen_reserved):
        raise RuntimeError("idle GPUs given to the planner overlap non-GEN reserved GPUs")
    # The caller's set is only read until an exit before the loop, which then hands it back
    # as ``result.idle`` uncopied (nothing changed it); the loop works on a copy.
    result = GapRatioResult(idle)
    total_weight = ordered_sum(weights)  # RLix's sum() of the same sequence, as 3.11 adds it
    budget_gpus = len(idle) + active_gpus
    if budget_gpus == 0:
        return result
    targets = result.targets
    fractions = []  # (target_ratio, target_gpu_count, gap) per row
    contenders: List[int] = []  # rows that are possible first winners (see the early exit below)
    for pid, _cid, cfg, remaining, _pc, eligible, commit_ok, _hp, _act, removed, n_active in rows:
        tp = cfg.tp_size
        ratio, count = 0.0, 0
        if eligible and total_weight != 0:
            ratio = (remaining * tp) / total_weight
            count = math.floor((ratio * budget_gpus) / tp + 0.5) * tp  # RLix's round-half-up, in bundles
            if count < tp:
                count = tp
        targets[pid] = count
        gap = ratio - (n_active * tp) / budget_gpus
        fractions.append((ratio, count, gap))
        if (
            commit_ok
            and len(cfg.device_mapping) // tp - n_active - (len(removed) if removed else 0) > 0
            and gap > eps
            and eligible
            and n_active * tp < count
            and ratio > 0
        ):
            contenders.append(len(fractions) - 1)  # has_available_inactive(), commit_ok, acceptor_key(s) is not None
    # Early exit, exactly equivalent to running the loop below: iteration 1 can only pick
    # an acceptor (acceptor_key not None) that has an available inactive rank and passes the
    # commit re-check; nothing changes before a first winner, so if no pipeline is all three
    # the loop ends after one iteration with no op added and ``idle`` untouched. This is the
    # common cycle (every grower at its maximum, or no grower), and it skips the heap setup.
    # The second common cycle has growers that cannot get a bundle: see no_first_winner.
    if not contenders or no_first_winner(inp, rows, fractions, contenders, idle):
        _check_bounds(inp, 1, 0)
        result.iterations = 1
        return result
    idle = set(idle)
    states = _pipeline_states(rows, fractions)
    protected: Set[Tuple[str, int]] = set()
    for cid, ranks in removed_by_plan.items():
        if cid.endswith("_actor_infer"):
            pid = cid[: -len("_actor_infer")]
            protected.update((pid, r) for r in ranks)
    reserved = inp.non_gen_reserved

    # (len(s.active_set) is s.active, spelled out in these per-iteration helpers)
    def refresh_gap(s: _PipelineState) -> None:
        s.gap = s.target_ratio - (len(s.active_set) * s.tp) / budget_gpus

    def shrink_budget(s: _PipelineState) -> int:
        floor = 0
        if s.eligible and s.target_gpu_count > 0:
            floor = s.target_gpu_count // s.tp
            if floor < 1:
                floor = 1
        spare = len(s.active_set) - floor
        return spare if spare > 0 else 0

    def acceptor_key(s: _PipelineState):
        if not (s.gap > eps and s.eligible and len(s.active_set) * s.tp < s.target_gpu_count and s.target_ratio > 0):
            return None
        return (-(s.gap / s.target_ratio), -s.gap, s.pipeline_id)

    gpu_pipelines = gpu_pipeline_index(inp)
    by_id = {s.pipeline_id: s for s in states}

    def owner(g: int) -> Optional[Tuple[_PipelineState, int]]:
        """The still-donatable worker holding GPU g, if any (ownership is unique)."""
        for pid in gpu_pipelines.get(g, ()):
            st = by_id.get(pid)
            if st is not None:
                r = st.cfg.rank_of_gpu[g]
                if r in st.donatable:
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
        return idle.issuperset(b) and reserved.isdisjoint(b)

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
            if not reserved.isdisjoint(b):
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

    heap: List[Tuple[tuple, int, int]] = []

    def push(s: _PipelineState) -> None:
        s.version += 1
        key = acceptor_key(s)
        if key is not None:
            heapq.heappush(heap, (key, s.index, s.version))

    for s in states:
        push(s)

    # A slow-path failure of acceptor X stays a failure until something it depends on
    # changes: X itself, a GPU of X's mapping turning idle, or a pipeline owning GPUs of
    # X's mapping changing its gap or budget (a receiver or a donor). ``dirty`` collects
    # those GPUs per iteration; a memoized failure is reused while none touch X's mapping.
    dirty_since: List[Set[int]] = []  # dirty_since[i] = GPUs changed after iteration i+1
    # still_failed(X) reads only the entries from X's failing iteration on, so the
    # entries of the iterations before the first failure are never read: they are
    # left empty rather than computed (the owned() unions are the costly part).
    first_failure_seen = False

    def still_failed(s: _PipelineState, iteration: int) -> bool:
        if s.failed_at < 0:
            return False
        for changed in dirty_since[s.failed_at - 1 : iteration - 1]:
            if not s.cfg.mapping_set.isdisjoint(changed):
                return False
        return True

    iterations = activations = 0
    while True:
        iterations += 1
        _check_bounds(inp, iterations, activations)
        tried: List[Tuple[tuple, int, int]] = []
        winner = None
        donor_pids: Optional[Set[str]] = None  # pipelines able to donate now; computed on the first slow path
        while heap:
            entry = heapq.heappop(heap)
            _key, idx, ver = entry
            s = states[idx]
            if s.version != ver:
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
                    first_failure_seen = True
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
        dirty: Set[int] = set()
        if first_failure_seen:
            dirty.update(s.bundle(rank))
            for ds, dr in picked:
                dirty.update(ds.bundle(dr))
        for c in changed.values():
            if first_failure_seen:
                dirty |= c.owned()
            refresh_gap(c)
            push(c)
        dirty_since.append(dirty)
    result.idle = idle
    result.activations = activations
    result.iterations = iterations
    return result
