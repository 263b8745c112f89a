"""What the gap-ratio planner reads of each pipeline, and its early exits.

Split from ``planner`` because most cycles end here: the planner first reads every
pipeline into a plain row (no per-pipeline objects), computes the targets, and only
builds the activation loop's state when :func:`no_first_winner` cannot prove that the
loop would end at once. Everything here reads; nothing mutates the plan or the inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Set

from harness.scheduler.types import ExecutionPlan, Priority, generation_cluster_id

if TYPE_CHECKING:
    from harness.scheduler.planner import GapRatioInputs

_GENERATION = Priority.GENERATION  # the enum attribute lookup is slow enough to show up per pipeline
_NO_RANKS: frozenset = frozenset()
#: The MILES line's demand for a held GENERATION cluster with no progress and no pending
#: estimate (rlops/rlix rlix/scheduler/planner.py ``_STARVATION_FLOOR_STEP_DEMAND`` at d455b0c)
STARVATION_FLOOR_STEP_DEMAND = 1.0
# The proof below scans the ranks of every contender. With many contenders (a large
# cluster) one of them can usually win, and the scan would only delay the loop that
# decides anyway, so beyond this many contenders the loop is left to decide.
MAX_CONTENDERS_TO_PROVE = 8


def _pending_estimate(est: Optional[int]) -> Optional[float]:
    if est is None:
        return None
    val = int(est)
    return float(val) if val > 0 else None


def demand_rows(plan: ExecutionPlan, inp: GapRatioInputs, removed_by_plan: Mapping[str, Set[int]]):
    """What RLix reads of each pipeline it considers, in registry order, as plain tuples.

    A row is (pid, cid, cfg, remaining, percent, eligible, commit_ok, has_pending,
    snapshot-active ranks (not copied), ranks this plan already shrinks, active count).
    Tuples, not :class:`_PipelineState`: most cycles end at the early exit, which needs
    none of the per-pipeline mutable state. Also returns the weights RLix sums (remaining
    * tp of the eligible pipelines, in registry order) and the active GPU count.
    """
    rows = []
    weights: List[float] = []
    active_gpus = 0
    pending_gen, allocations, progress_totals = inp.pending_gen, inp.allocations, inp.progress_totals
    closed, frozen = plan.clusters_to_remove, inp.frozen
    floor = inp.demand_floor
    gen_clusters = inp.gen_clusters
    if gen_clusters is None:
        gen_clusters = [(pid, generation_cluster_id(pid), entry.infer) for pid, entry in inp.registry.items()]
    for pid, cid, cfg in gen_clusters:
        has_pending = cid in pending_gen
        remaining, step_target = progress_totals(pid)
        if step_target <= 0.0:
            est = _pending_estimate(pending_gen.get(cid)) if has_pending else None
            if est is not None:
                remaining = step_target = est
            elif floor and cid in allocations:
                # MILES (d455b0c): a cluster still in the allocations keeps a floor demand,
                # so it stays visible as a receiver and as a donor
                remaining = step_target = STARVATION_FLOOR_STEP_DEMAND
            else:
                continue  # no reports and no estimate: RLix skips the pipeline entirely
            percent = 1.0
        else:
            percent = remaining / step_target
        if has_pending:
            remaining += step_target  # demand inflation for a pipeline waiting to start
            percent = remaining / step_target
        alloc = allocations.get(cid)
        active = alloc.active_dp_ranks if alloc is not None and alloc.priority == _GENERATION else _NO_RANKS
        removed = removed_by_plan.get(cid) if removed_by_plan else None
        n_active = len(active - removed) if removed else len(active)
        in_allocs = alloc is not None
        open_ = cid not in closed and cid not in frozen
        eligible = open_ and (has_pending or n_active > 0 or in_allocs)
        rows.append(
            (
                pid,
                cid,
                cfg,
                remaining,
                percent,
                eligible,
                open_ and (has_pending or in_allocs),
                has_pending,
                active,
                removed,
                n_active,
            )
        )
        tp = cfg.tp_size
        if eligible:
            weights.append(remaining * tp)
        active_gpus += n_active * tp
    return rows, weights, active_gpus


def gpu_pipeline_index(inp: GapRatioInputs) -> Mapping[int, List[str]]:
    """GPU -> pipelines whose actor_infer mapping holds it, in registry order. The model
    caches it across cycles (it changes only with the registry); built here otherwise."""
    if inp.gpu_pipelines is not None:
        return inp.gpu_pipelines
    index: Dict[int, List[str]] = {}
    for pid, entry in inp.registry.items():
        for g in entry.infer.device_mapping:
            index.setdefault(g, []).append(pid)
    return index


def no_first_winner(inp: GapRatioInputs, rows, fractions, contenders: List[int], idle: Set[int]) -> bool:
    """True if no contender can win iteration 1, proven without the loop's state.

    In iteration 1 an acceptor wins with its lowest free rank, or else (when a donor
    shares a GPU with it) with the best candidate of RLix's full scoring. A free rank needs
    a whole bundle idle, so a contender none of whose mapped GPUs is idle has none; and a
    candidate rank is only scored feasible if the first still-active owner of each of its
    missing GPUs is a donor. A contender with no such rank fails, and a failing contender
    changes nothing the others see: if all fail, the loop would end after one iteration
    with no op, exactly like the first early exit. Anything else is left to the loop.
    """
    if len(contenders) > MAX_CONTENDERS_TO_PROVE:
        return False
    for i in contenders:
        if not rows[i][2].mapping_set.isdisjoint(idle):
            return False  # it may have a free rank
    eps = inp.epsilon
    donors: Set[str] = set()
    for (pid, _c, cfg, _r, _p, eligible, _ok, _hp, _a, _rm, n_active), (_ratio, count, gap) in zip(rows, fractions):
        floor = 0  # shrink_budget(ds) > 0, as in the loop
        if eligible and count > 0:
            floor = count // cfg.tp_size
            if floor < 1:
                floor = 1
        if gap < -eps and n_active - floor > 0:
            donors.add(pid)
    if not donors:
        return True
    gpu_pipelines = gpu_pipeline_index(inp)
    row_of = {row[0]: row for row in rows}
    for i in contenders:
        pid, cfg = rows[i][0], rows[i][2]
        near = inp.neighbours.get(pid) if inp.neighbours is not None else None
        if near is None:
            near = {q for g in cfg.device_mapping for q in gpu_pipelines.get(g, ())}
        if donors.isdisjoint(near):
            continue  # the loop skips it without scoring
        if _has_coverable_rank(rows[i], row_of, donors, inp.non_gen_reserved, gpu_pipelines):
            return False  # RLix's full scoring decides
    return True


def _first_owner_is_donor(g: int, row_of, donors: Set[str], gpu_pipelines) -> bool:
    """The loop's owner(g) at iteration 1 (the first pipeline in registry order whose
    snapshot-active, not shrunk rank holds g) exists and is a donor."""
    for q in gpu_pipelines.get(g, ()):
        row = row_of.get(q)
        if row is None:
            continue
        r = row[2].rank_of_gpu[g]
        active, removed = row[8], row[9]
        if r in active and not (removed and r in removed):
            return q in donors
    return False


def _has_coverable_rank(row, row_of, donors: Set[str], reserved: Set[int], gpu_pipelines) -> bool:
    """Some candidate rank of score_candidates could be feasible (no GPU of it is idle)."""
    _pid, _c, cfg, _r, _p, _e, _ok, _hp, active, removed, _n = row
    tp, mapping = cfg.tp_size, cfg.device_mapping
    for r in range(len(mapping) // tp):
        if r in active and not (removed and r in removed):
            continue  # active now (inactive_sorted skips it)
        if removed and r in removed:
            continue  # protected: shrunk by this plan
        bundle = mapping[r * tp : (r + 1) * tp]
        if not reserved.isdisjoint(bundle):
            continue
        if all(_first_owner_is_donor(g, row_of, donors, gpu_pipelines) for g in bundle):
            return True
    return False
