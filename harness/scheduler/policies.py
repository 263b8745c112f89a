"""Scheduling policies: who gets the GENERATION GPUs, behind one interface.

RLix answers "how should k pipelines share N GPUs" with its gap-ratio planner
(``harness.scheduler.planner``); that stays the default and is not touched here. The three
alternatives below answer the same question the way other systems do, so that a sweep
can put them side by side on one workload (docs/policies.md):

* ``static_partition`` -- every pipeline keeps a fixed, disjoint set of GPUs; GENERATION
  takes every bundle of its part whenever it has work; no GPU moves between pipelines.
* ``round_robin`` -- RollMux-style phase-level round robin (Wu et al., "RollMux:
  Phase-Level Multiplexing for Disaggregated RL Post-Training", arXiv 2512.11306): the
  pipelines that share GPUs form a co-execution group; one member at a time holds the
  group's rollout turn (it takes whatever bundles of its mapping are idle), and the turn
  passes, in a fixed cyclic order, when the holder's rollout phase ends.
* ``acquire_yield`` -- llm-d time slicing (llm-d-incubation/llm-d-rl-time-slicing;
  llm-d/llm-d issue #1546): a pipeline acquires its whole inference mapping for its
  rollout phase (all or nothing, first come first served per GPU) and yields it at the
  phase's end; its training cannot take GPUs another pipeline holds for a phase.

Like the planner, everything here is pure: it reads the scheduler state and the cycle's
plan and adds shrink/expand ops; the plan is then validated like any other (the 11
conditions). A rollout phase ends when the pipeline's progress reports say no demand is
left (``remaining == 0``), or when it releases its GENERATION cluster itself.
"""

from __future__ import annotations

from typing import AbstractSet, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from harness.scheduler.planner import GapRatioResult
from harness.scheduler.types import ExecutionPlan, ExpandOp, PipelineEntry, Priority, ShrinkOp, parse_cluster_id

GAP_RATIO = "gap_ratio"
POLICIES = (GAP_RATIO, "static_partition", "round_robin", "acquire_yield")


def check_policy(name: object) -> str:
    """The policy's name, or ValueError (one line) naming the known ones."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return str(name)


# ---------------------------------------------------------------- parts and groups
def partition_of(
    registry: Mapping[str, PipelineEntry], explicit: Optional[Mapping[str, Sequence[int]]]
) -> Dict[str, Set[int]]:
    """Each pipeline's fixed GPUs. Explicit parts are taken as given; without them, every
    pipeline first claims its training GPUs, then (in registry order) its inference GPUs,
    and a GPU goes to the first pipeline that claims it. (A pipeline that registers late
    takes its training GPUs out of earlier parts; give explicit parts to rule that out.)"""
    if explicit:
        return {pid: set(explicit.get(pid, ())) for pid in registry}
    owner: Dict[int, str] = {}
    for generation in (False, True):
        for pid, entry in registry.items():
            for cfg in entry.clusters.values():
                if cfg.is_generation == generation:
                    for g in cfg.device_mapping:
                        owner.setdefault(g, pid)
    parts: Dict[str, Set[int]] = {pid: set() for pid in registry}
    for g, pid in owner.items():
        parts[pid].add(g)
    return parts


def groups_of(registry: Mapping[str, PipelineEntry], explicit: Optional[Sequence[Sequence[str]]]) -> List[List[str]]:
    """Co-execution groups in a fixed order. Explicit groups are taken as given (a
    registered pipeline in none is a group of its own); without them, a group is a set of
    pipelines connected by shared GPUs (any mapping), members in registry order."""
    pids = list(registry)
    if explicit:
        listed = [[p for p in g if p in registry] for g in explicit]
        seen = {p for g in listed for p in g}
        return [g for g in listed if g] + [[p] for p in pids if p not in seen]
    gpus = {pid: {g for cfg in registry[pid].clusters.values() for g in cfg.device_mapping} for pid in pids}
    group_of: Dict[str, int] = {}
    groups: List[List[str]] = []
    for pid in pids:
        joined = sorted({group_of[q] for q in group_of if not gpus[q].isdisjoint(gpus[pid])})
        if not joined:
            group_of[pid] = len(groups)
            groups.append([pid])
            continue
        keep = joined[0]
        for other in joined[1:]:
            for q in groups[other]:
                group_of[q] = keep
            groups[keep].extend(groups[other])
            groups[other] = []
        groups[keep].append(pid)
        group_of[pid] = keep
    order = {pid: i for i, pid in enumerate(pids)}
    return [sorted(g, key=order.__getitem__) for g in groups if g]


# ---------------------------------------------------------------- what each pipeline wants
class _Gen:
    """One pipeline's GENERATION cluster as a policy sees it this cycle."""

    __slots__ = ("pid", "cid", "cfg", "active", "shrinking", "wants", "open")

    def __init__(self, pid, cid, cfg, active: Set[int], shrinking: Set[int], wants: bool, open_: bool) -> None:
        self.pid, self.cid, self.cfg = pid, cid, cfg
        self.active = active - shrinking  # active after this plan's shrinks
        self.shrinking = shrinking
        self.wants = wants  # has work left in its rollout phase
        self.open = open_  # may receive ranks (pending or allocated, not removed/frozen)

    def bundles(self) -> Iterable[Tuple[int, List[int]]]:
        for r in range(self.cfg.max_dp_workers):
            if r not in self.active and r not in self.shrinking:
                yield r, self.cfg.bundle(r)


def _gens(state, plan: ExecutionPlan, pending_gen: Mapping[str, Optional[int]], frozen: Set[str]) -> List[_Gen]:
    shrinking: Dict[str, Set[int]] = {}
    for op in plan.shrinks:
        shrinking.setdefault(op.cluster_id, set()).update(op.dp_ranks_to_remove)
    out = []
    for pid, cid, cfg in state.gen_clusters():
        alloc = state.allocations.get(cid)
        gen_alloc = alloc is not None and alloc.priority == Priority.GENERATION
        active = set(alloc.active_dp_ranks) if gen_alloc else set()
        remaining, target = state.progress.totals(pid)
        has_pending = cid in pending_gen
        if target > 0.0:
            wants = remaining > 0.0 or has_pending
        else:  # no reports: a pending request with an estimate is work (RLix skips the rest)
            est = pending_gen.get(cid) if has_pending else None
            wants = est is not None and int(est) > 0
        # a cluster awaiting its own release to zero never receives (RLix's fixed variant)
        open_ = (
            (has_pending or alloc is not None)
            and cid not in plan.clusters_to_remove
            and cid not in frozen
            and cid not in state.planned_releases
        )
        out.append(_Gen(pid, cid, cfg, active, shrinking.get(cid, set()), wants and open_, open_))
    return out


def _expand(plan: ExecutionPlan, g: _Gen, rank: int, bundle: List[int], pending_gen) -> None:
    op = next((e for e in plan.expands if e.cluster_id == g.cid), None)
    if op is None:
        plan.expands.append(ExpandOp(g.cid, {rank: sorted(bundle)}, g.cid in pending_gen, g.cfg.tp_size))
    else:
        op.dp_rank_to_gpus[rank] = sorted(bundle)
    g.active.add(rank)


def _yield_all(plan: ExecutionPlan, g: _Gen, available: Set[int]) -> None:
    """Shrink every active rank of ``g`` (its phase is over); the GPUs become available."""
    ranks = sorted(g.active)
    if not ranks:
        return
    op = plan.shrink_op(g.cid)
    if op is None:
        plan.shrinks.append(ShrinkOp(g.cid, ranks))
    else:
        op.dp_ranks_to_remove.extend(r for r in ranks if r not in op.dp_ranks_to_remove)
    for r in ranks:
        available.update(g.cfg.bundle(r))
    g.shrinking.update(ranks)
    g.active.clear()


def _fill(
    plan: ExecutionPlan,
    g: _Gen,
    available: Set[int],
    pending_gen,
    allowed: Optional[Set[int]] = None,
    blocked: AbstractSet[int] = frozenset(),
) -> int:
    """Expand every inactive rank of ``g`` whose whole bundle is available (and inside
    ``allowed``, and outside ``blocked``). Returns the number of ranks added."""
    added = 0
    for r, bundle in g.bundles():
        if (
            available.issuperset(bundle)
            and (allowed is None or allowed.issuperset(bundle))
            and blocked.isdisjoint(bundle)
        ):
            _expand(plan, g, r, bundle, pending_gen)
            available.difference_update(bundle)
            added += 1
    return added


# ---------------------------------------------------------------- the three policies
def _ever_registered(state) -> Dict[str, PipelineEntry]:
    """Every pipeline registered so far, in first-registration order: parts and groups are
    drawn over these, so a pipeline that finishes and unregisters leaves its GPUs idle
    instead of handing them to a neighbour (a part is fixed for the run)."""
    seen: Dict[str, PipelineEntry] = state.policy_memo.setdefault("registered", {})
    for pid, entry in state.registry.items():
        seen[pid] = entry
    return seen


def _static_partition(state, plan, available, gens, opts, pending_gen) -> None:
    parts = partition_of(_ever_registered(state), opts.partition)
    for g in gens:
        if g.wants:
            _fill(plan, g, available, pending_gen, allowed=parts.get(g.pid, set()))


def _round_robin(state, plan, available, gens, opts, pending_gen) -> None:
    by_pid = {g.pid: g for g in gens}
    turns: Dict[str, str] = state.policy_memo.setdefault("turn", {})
    for group in groups_of(_ever_registered(state), opts.groups):
        key = ",".join(group)
        members = [by_pid[p] for p in group if p in by_pid]
        holder = by_pid.get(turns.get(key, ""))
        if holder is not None and not holder.wants:
            if any(m.wants for m in members if m is not holder):
                _yield_all(plan, holder, available)
                holder = None
            # an idle holder with nobody waiting keeps its ranks (nothing to gain)
        if holder is None or not holder.open:
            start = group.index(turns[key]) + 1 if turns.get(key) in group else 0
            order = group[start:] + group[:start]
            holder = next((by_pid[p] for p in order if p in by_pid and by_pid[p].wants), None)
            if holder is None:
                continue
            turns[key] = holder.pid
        for m in members:  # a member out of turn yields as soon as its own phase is over
            if m is not holder and m.active and not m.wants:
                _yield_all(plan, m, available)
        if holder.wants:
            _fill(plan, holder, available, pending_gen)


def _acquire_yield(state, plan, available, gens, opts, pending_gen) -> None:
    queue: List[str] = state.policy_memo.setdefault("queue", [])
    by_pid = {g.pid: g for g in gens}
    queue[:] = [p for p in queue if p in by_pid and by_pid[p].wants and not by_pid[p].active]
    for g in gens:  # join the lock queue (registry order within one cycle)
        if g.wants and not g.active and g.pid not in queue:
            queue.append(g.pid)
    wanted: Set[int] = set()
    for pid in queue:
        wanted.update(by_pid[pid].cfg.device_mapping)
    for g in gens:  # a holder whose phase is over yields what a waiter needs
        if g.active and not g.wants and any(not wanted.isdisjoint(g.cfg.bundle(r)) for r in g.active):
            _yield_all(plan, g, available)
    for g in gens:  # a holder still in its phase gets back its own preempted bundles
        if g.active and g.wants:
            _fill(plan, g, available, pending_gen, blocked=wanted)
    ahead: Set[int] = set()
    for pid in list(queue):
        g = by_pid[pid]
        mapping = set(g.cfg.device_mapping)
        if ahead.isdisjoint(mapping) and available.issuperset(mapping):
            _fill(plan, g, available, pending_gen)
            queue.remove(pid)
        ahead.update(mapping)  # FIFO per GPU: nobody overtakes an earlier waiter on its GPUs


_PLANNERS = {"static_partition": _static_partition, "round_robin": _round_robin, "acquire_yield": _acquire_yield}


def plan_generation(
    state, plan: ExecutionPlan, available: Set[int], pending_gen: Mapping[str, Optional[int]], frozen: Set[str], opts
) -> GapRatioResult:
    """Phase 4 of a cycle under a policy other than gap_ratio: add GENERATION shrink and
    expand ops to ``plan`` from ``available`` (idle GPUs not reserved for non-GEN work)."""
    gens = _gens(state, plan, pending_gen, frozen)
    _PLANNERS[opts.policy](state, plan, available, gens, opts, pending_gen)
    return GapRatioResult(available)


def may_preempt(state, opts, donor_cid: str, requester_cid: str) -> bool:
    """Phase 2's donor rule: under acquire_yield a non-GEN request may shrink only its own
    pipeline's GENERATION ranks or those of a pipeline whose rollout phase is over (it
    would yield them anyway); every other policy preempts like RLix."""
    if opts.policy != "acquire_yield":
        return True
    donor_pid = parse_cluster_id(donor_cid)[0]
    if parse_cluster_id(requester_cid)[0] == donor_pid:
        return True
    remaining, target = state.progress.totals(donor_pid)
    return target > 0.0 and remaining <= 0.0
