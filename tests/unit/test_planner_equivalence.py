"""The optimized gap-ratio planner makes exactly RLix's decisions.

``harness.scheduler.planner.gap_ratio_plan`` replaces RLix's rescans with heaps and
indexes (see its docstring). ``oracle_gap_ratio`` (next to this file) is a slow, literal
transcription of the reference algorithm (docs/modelled-systems.md#rlix-gap-ratio-planner). Hypothesis generates
random planner inputs — overlapping and disjoint infer mappings, tp 1/2/4 (aligned and
misaligned TP groups, so a donor bundle can leave GPUs the receiver does not use),
disjoint active ownership, non-GEN reserved GPUs, idle sets, progress totals, pending
estimates and pre-existing Phase 0.5/2 shrink ops — and both planners must produce the
same shrink ops (rank order included), the same expand ops (dict insertion order and
``has_pending_request``), and the same idle set, or raise the same bounds error.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.scheduler.planner import GapRatioInputs, PlannerLimitExceeded, gap_ratio_plan
from harness.scheduler.types import (
    ClusterAllocation,
    ClusterConfig,
    ExecutionPlan,
    PipelineEntry,
    Priority,
    ShrinkOp,
)

try:
    from oracle_gap_ratio import OracleLimitExceeded, oracle_gap_ratio
except ImportError:  # e.g. --import-mode=importlib: the test directory is not on sys.path
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from oracle_gap_ratio import OracleLimitExceeded, oracle_gap_ratio


# ----------------------------------------------------------------------------- inputs


@dataclass
class PlannerCase:
    registry: Dict[str, PipelineEntry]
    allocations: Dict[str, ClusterAllocation]
    non_gen_reserved: Set[int]
    idle: Set[int]
    pending_gen: Dict[str, Optional[int]]
    totals: Dict[str, Tuple[float, float]]
    shrinks: List[ShrinkOp] = field(default_factory=list)
    clusters_to_remove: Set[str] = field(default_factory=set)
    epsilon: float = 0.0
    max_iterations: int = 10_000
    max_activations: int = 1_000

    def describe(self) -> str:
        lines = []
        for pid, e in self.registry.items():
            a = self.allocations.get(f"{pid}_actor_infer")
            lines.append(
                f"{pid}: tp={e.infer.tp_size} map={list(e.infer.device_mapping)} "
                f"alloc={None if a is None else (a.priority.name, sorted(a.active_dp_ranks))} "
                f"pending={self.pending_gen.get(pid + '_actor_infer', 'no')} totals={self.totals.get(pid)}"
            )
        lines.append(
            f"idle={sorted(self.idle)} reserved={sorted(self.non_gen_reserved)} "
            f"shrinks={[(o.cluster_id, o.dp_ranks_to_remove) for o in self.shrinks]} eps={self.epsilon}"
        )
        return "\n".join(lines)


def entry(pid: str, tp: int, mapping: List[int]) -> PipelineEntry:
    cfg = ClusterConfig("actor_infer", tp, tuple(sorted(mapping)))
    return PipelineEntry(pid, f"ns_{pid}", {"actor_infer": cfg}, admitted=True)


def gen_alloc(pid: str, e: PipelineEntry, ranks, priority=Priority.GENERATION) -> ClusterAllocation:
    cfg = e.infer
    ranks = set(ranks)
    gpus = sorted(g for r in ranks for g in cfg.bundle(r))
    return ClusterAllocation(f"{pid}_actor_infer", gpus, priority, set(ranks), {r: cfg.bundle(r) for r in ranks})


def run_production(case: PlannerCase):
    plan = ExecutionPlan(shrinks=copy.deepcopy(case.shrinks), clusters_to_remove=set(case.clusters_to_remove))
    try:
        res = gap_ratio_plan(
            plan,
            GapRatioInputs(
                registry=case.registry,
                allocations=case.allocations,
                non_gen_reserved=set(case.non_gen_reserved),
                idle=set(case.idle),
                pending_gen=dict(case.pending_gen),
                progress_totals=lambda pid: case.totals.get(pid, (0.0, 0.0)),
                epsilon=case.epsilon,
                max_iterations=case.max_iterations,
                max_activations=case.max_activations,
            ),
        )
    except PlannerLimitExceeded:
        return "limit"
    return summarize(plan, res.idle)


def run_oracle(case: PlannerCase):
    plan = ExecutionPlan(shrinks=copy.deepcopy(case.shrinks), clusters_to_remove=set(case.clusters_to_remove))
    try:
        idle = oracle_gap_ratio(
            plan,
            registry=case.registry,
            allocations=case.allocations,
            non_gen_reserved=set(case.non_gen_reserved),
            idle=set(case.idle),
            pending_gen=dict(case.pending_gen),
            progress_totals=lambda pid: case.totals.get(pid, (0.0, 0.0)),
            epsilon=case.epsilon,
            max_iterations=case.max_iterations,
            max_activations=case.max_activations,
        )
    except OracleLimitExceeded:
        return "limit"
    return summarize(plan, idle)


def summarize(plan: ExecutionPlan, idle: Set[int]):
    return {
        "shrinks": [(op.cluster_id, list(op.dp_ranks_to_remove)) for op in plan.shrinks],
        "expands": [
            (op.cluster_id, [(r, list(g)) for r, g in op.dp_rank_to_gpus.items()], op.has_pending_request, op.tp_size)
            for op in plan.expands
        ],
        "idle": sorted(idle),
    }


def assert_same(case: PlannerCase):
    expected = run_oracle(case)
    actual = run_production(case)
    assert actual == expected, (
        f"planner differs from the oracle on\n{case.describe()}\noracle={expected}\nplanner={actual}"
    )
    return expected


# ----------------------------------------------------------------------------- strategy


def rarely(one_in: int):
    """True about once in ``one_in`` draws (False is the simplest value, so it shrinks to False)."""
    return st.sampled_from([False] * (one_in - 1) + [True])


@st.composite
def tp_groups(draw, n: int, tp: int) -> List[int]:
    """A non-empty infer mapping made of disjoint contiguous TP groups (not necessarily aligned)."""
    if tp == 1:
        style = draw(st.sampled_from(["all", "range", "subset"]))
        if style == "all":
            return list(range(n))
        if style == "range":
            lo = draw(st.integers(0, n - 1))
            hi = draw(st.integers(lo + 1, n))
            return list(range(lo, hi))
        return sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n)))
    style = draw(st.sampled_from(["aligned_all", "aligned_range", "any"]))
    aligned = [s for s in range(0, n - tp + 1, tp)]
    if style == "aligned_all":
        starts = aligned
    elif style == "aligned_range":
        i = draw(st.integers(0, len(aligned) - 1))
        j = draw(st.integers(i + 1, len(aligned)))
        starts = aligned[i:j]
    else:
        order = draw(st.permutations(list(range(0, n - tp + 1))))
        k = draw(st.integers(1, max(1, n // tp)))
        taken: Set[int] = set()
        starts = []
        for s in order:
            grp = set(range(s, s + tp))
            if grp & taken:
                continue
            taken |= grp
            starts.append(s)
            if len(starts) == k:
                break
    return sorted(g for s in starts for g in range(s, s + tp))


@st.composite
def planner_cases(draw) -> PlannerCase:
    n = draw(st.integers(2, 16))
    n_pipes = draw(st.integers(1, 6))
    registry: Dict[str, PipelineEntry] = {}
    pids = draw(st.permutations([f"p{i}" for i in range(n_pipes)]))  # registry order != id order
    for pid in pids:
        registry[pid] = _draw_entry(draw, pid, n)

    owner: Dict[int, str] = {}
    reserved: Set[int] = set(draw(st.sets(st.integers(0, n - 1), max_size=n // 3))) if draw(rarely(2)) else set()
    allocations: Dict[str, ClusterAllocation] = {}
    _draw_init_grants(draw, pids, registry, owner, reserved, allocations)
    active = _draw_active_ranks(draw, pids, registry, owner, reserved, allocations)
    shrinks, idle = _draw_shrinks(draw, active, registry, owner, reserved)
    _draw_idle(draw, n, owner, reserved, idle)
    pending, totals = _draw_demand(draw, pids)
    remove, eps, max_it, max_act = _draw_limits(draw, pids)
    return PlannerCase(registry, allocations, reserved, idle, pending, totals, shrinks, remove, eps, max_it, max_act)


def _draw_entry(draw, pid: str, n: int) -> PipelineEntry:
    tps = [1, 2] + ([4] if n >= 4 else [])
    tp = draw(st.sampled_from(tps).filter(lambda t: t <= n))
    return entry(pid, tp, draw(tp_groups(n, tp)))


def _draw_init_grants(draw, pids, registry, owner, reserved, allocations) -> None:
    """A few actor_infer clusters held at a non-GEN priority (INIT grant): whole mapping, reserved."""
    for pid in pids:
        e = registry[pid]
        m = set(e.infer.device_mapping)
        if draw(rarely(12)) and not (m & set(owner)):
            allocations[f"{pid}_actor_infer"] = gen_alloc(
                pid, e, range(e.infer.max_dp_workers), Priority.INITIALIZATION
            )
            reserved |= m
            for g in m:
                owner[g] = pid


def _draw_active_ranks(draw, pids, registry, owner, reserved, allocations) -> Dict[str, Set[int]]:
    """GEN active ranks with disjoint ownership (in a drawn pipeline order)."""
    act_order = draw(st.permutations(list(pids)))
    active: Dict[str, Set[int]] = {}
    p_active = draw(st.sampled_from([0.8, 1.0, 0.5, 0.2]))
    for pid in act_order:
        cid = f"{pid}_actor_infer"
        if cid in allocations:
            continue
        e = registry[pid]
        ranks: Set[int] = set()
        for r in draw(st.permutations(list(range(e.infer.max_dp_workers)))):
            b = set(e.infer.bundle(r))
            if b & reserved or b & set(owner):
                continue
            if draw(st.floats(0, 1)) < p_active:
                ranks.add(r)
                for g in b:
                    owner[g] = pid
        if ranks or draw(rarely(4)):
            allocations[cid] = gen_alloc(pid, e, ranks)  # possibly an entry with no active ranks
            active[pid] = ranks
    return active


def _draw_shrinks(draw, active, registry, owner, reserved) -> Tuple[List[ShrinkOp], Set[int]]:
    """Pre-existing shrink ops (Phase 0.5 planned releases / Phase 2 preemption): their
    GPUs leave their owner for the reserved set or the idle pool."""
    shrinks: List[ShrinkOp] = []
    idle: Set[int] = set()
    if draw(rarely(3)):
        for pid, ranks in active.items():
            for r in sorted(ranks):
                if draw(rarely(3)):
                    cid = f"{pid}_actor_infer"
                    op = next((o for o in shrinks if o.cluster_id == cid), None)
                    if op is None:
                        shrinks.append(ShrinkOp(cid, [r]))
                    else:
                        op.dp_ranks_to_remove.append(r)
                    b = registry[pid].infer.bundle(r)
                    to_reserved = draw(rarely(3))
                    for g in b:
                        del owner[g]
                        (reserved if to_reserved else idle).add(g)
        draw(st.randoms()).shuffle(shrinks)
    return shrinks, idle


def _draw_idle(draw, n, owner, reserved, idle) -> None:
    """The rest: idle, or in limbo (neither idle nor owned nor reserved: e.g. held by an
    allocation the planner does not see); a scarce idle pool forces the donor path."""
    idle_p = draw(st.sampled_from([1.0, 1.0, 0.3, 0.0]))
    for g in range(n):
        if g in owner or g in reserved or g in idle:
            continue
        if draw(st.floats(0, 1)) <= idle_p:
            idle.add(g)


def _draw_demand(draw, pids) -> Tuple[Dict[str, Optional[int]], Dict[str, Tuple[float, float]]]:
    """Each GEN cluster's pending step estimate and each pipeline's remaining/total work."""
    pending: Dict[str, Optional[int]] = {}
    totals: Dict[str, Tuple[float, float]] = {}
    for pid in pids:
        cid = f"{pid}_actor_infer"
        if not draw(rarely(4)):
            est_kind = draw(st.sampled_from(["pos", "pos", "pos", "pos", "none", "nonpos"]))
            pending[cid] = (
                draw(st.integers(1, 40))
                if est_kind == "pos"
                else None
                if est_kind == "none"
                else draw(st.integers(-2, 0))
            )
        kind = draw(st.sampled_from(["none", "int", "int", "frac"]))
        if kind == "int":
            req = draw(st.integers(1, 24))
            done = draw(st.integers(0, req))
            totals[pid] = (float(req - done), float(req))
        elif kind == "frac":
            req = draw(st.integers(1, 7)) * 3
            done = draw(st.integers(0, req * 3)) / 3.0
            totals[pid] = (max(0.0, req - done), float(req))
    return pending, totals


def _draw_limits(draw, pids) -> Tuple[Set[str], float, int, int]:
    """A cluster removed mid-plan, the gap epsilon and, rarely, tight iteration limits."""
    remove: Set[str] = set()
    if draw(rarely(15)):
        remove.add(f"{draw(st.sampled_from(pids))}_actor_infer")
    eps = draw(st.sampled_from([0.0, 0.0, 0.0, 0.02, 0.1]))
    max_act, max_it = 1_000, 10_000
    if draw(rarely(15)):
        max_act = draw(st.integers(0, 3))
        max_it = draw(st.integers(1, 6))
    return remove, eps, max_it, max_act


# not derandomized: each suite run draws 150 new cases (was 300; the explicit cases below pin the known ones)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(planner_cases())
def test_planner_matches_reference_oracle(case: PlannerCase):
    assert_same(case)


# ----------------------------------------------------------------------------- explicit cases


def case_of(pipes, *, idle, active=None, reserved=(), pending=None, totals=None, shrinks=(), empty_allocs=(), eps=0.0):
    registry = {pid: entry(pid, tp, mapping) for pid, (tp, mapping) in pipes.items()}
    allocations = {}
    for pid, ranks in (active or {}).items():
        allocations[f"{pid}_actor_infer"] = gen_alloc(pid, registry[pid], ranks)
    for pid in empty_allocs:
        allocations[f"{pid}_actor_infer"] = gen_alloc(pid, registry[pid], [])
    return PlannerCase(
        registry,
        allocations,
        set(reserved),
        set(idle),
        {f"{k}_actor_infer": v for k, v in (pending or {}).items()},
        dict(totals or {}),
        [ShrinkOp(c, list(r)) for c, r in shrinks],
        set(),
        eps,
    )


def test_free_ranks_first_single_pipeline():
    c = case_of({"a": (1, [0, 1, 2, 3])}, idle={0, 1, 2, 3}, pending={"a": 4})
    out = assert_same(c)
    assert out["expands"] == [("a_actor_infer", [(0, [0]), (1, [1]), (2, [2]), (3, [3])], True, 1)]
    assert out["shrinks"] == [] and out["idle"] == []


def test_slow_path_donor_needed_no_free_rank():
    # a holds everything, is nearly done; b starts with a large estimate: b's ranks need donors
    c = case_of(
        {"a": (1, [0, 1, 2, 3]), "b": (1, [0, 1, 2, 3])},
        idle=set(),
        active={"a": [0, 1, 2, 3]},
        pending={"b": 10},
        totals={"a": (1.0, 10.0)},
    )
    out = assert_same(c)
    assert out["shrinks"] and out["shrinks"][0][0] == "a_actor_infer"
    assert out["expands"][0][0] == "b_actor_infer"


def test_donor_leftovers_tp_mismatch():
    # donor a has tp=2 bundles [0,1],[2,3]; receiver b has tp=1 ranks on GPUs 1 and 3 only:
    # taking a's bundle [0,1] for b's GPU 1 leaves GPU 0 idle (a leftover nobody asked for)
    c = case_of(
        {"a": (2, [0, 1, 2, 3]), "b": (1, [1, 3])},
        idle=set(),
        active={"a": [0, 1]},
        pending={"b": 30},
        totals={"a": (1.0, 10.0)},
    )
    out = assert_same(c)
    assert out["shrinks"] == [("a_actor_infer", [0])]
    assert out["expands"] == [("b_actor_infer", [(0, [1])], True, 1)]
    assert out["idle"] == [0]


def test_donor_leftovers_are_reused_by_a_misaligned_tp2_receiver():
    # a: tp=2 [0,1],[2,3],[4,5]; c: tp=2 misaligned groups [1,2],[3,4]; leftovers of one
    # donor bundle are combined with a second donor bundle
    c = case_of(
        {"a": (2, [0, 1, 2, 3, 4, 5]), "c": (2, [1, 2, 3, 4])},
        idle=set(),
        active={"a": [0, 1, 2]},
        pending={"c": 40},
        totals={"a": (0.5, 10.0)},
    )
    out = assert_same(c)
    assert out["expands"] and out["expands"][0][0] == "c_actor_infer"


def test_shrink_budget_limits_donation_per_pipeline():
    c = case_of(
        {"a": (1, [0, 1, 2, 3, 4, 5]), "b": (2, [0, 1, 2, 3, 4, 5])},
        idle=set(),
        active={"a": [0, 1, 2, 3, 4, 5]},
        pending={"b": 5},
        totals={"a": (5.0, 10.0)},
    )
    assert_same(c)


def test_donor_preference_by_percent_remaining():
    # two donors; receiver c can take a bundle from either a (nearly done) or b (lots left)
    c = case_of(
        {"a": (1, [0, 1]), "b": (1, [2, 3]), "c": (1, [0, 2])},
        idle=set(),
        active={"a": [0, 1], "b": [0, 1]},
        pending={"c": 50},
        totals={"a": (1.0, 10.0), "b": (9.0, 10.0)},
    )
    out = assert_same(c)
    assert out["expands"][0][0] == "c_actor_infer"


def test_pre_existing_shrinks_are_protected_and_merged():
    c = case_of(
        {"a": (1, [0, 1, 2, 3]), "b": (1, [0, 1, 2, 3])},
        idle={3},
        active={"a": [0, 1, 2, 3]},
        pending={"b": 10},
        totals={"a": (2.0, 10.0)},
        shrinks=[("a_actor_infer", [3])],
    )
    out = assert_same(c)
    assert out["shrinks"][0][0] == "a_actor_infer" and out["shrinks"][0][1][0] == 3


def test_ineligible_receiver_mutates_no_donor():
    # b has progress but no pending request and no allocation: never a receiver
    c = case_of(
        {"a": (1, [0, 1]), "b": (1, [0, 1])},
        idle=set(),
        active={"a": [0, 1]},
        totals={"a": (1.0, 10.0), "b": (10.0, 10.0)},
    )
    out = assert_same(c)
    assert out["shrinks"] == [] and out["expands"] == []


def test_reserved_gpus_are_never_planned():
    c = case_of({"a": (2, [0, 1, 2, 3])}, idle={2, 3}, reserved={1}, pending={"a": 3})
    out = assert_same(c)
    assert out["expands"] == [("a_actor_infer", [(1, [2, 3])], True, 2)]


def test_empty_allocation_entry_is_eligible_without_pending():
    c = case_of({"a": (1, [0, 1])}, idle={0, 1}, empty_allocs=["a"], totals={"a": (4.0, 8.0)})
    out = assert_same(c)
    assert out["expands"] == [("a_actor_infer", [(0, [0]), (1, [1])], False, 1)]


def test_planner_bounds_raise_in_both():
    c = case_of({"a": (1, [0, 1, 2, 3])}, idle={0, 1, 2, 3}, pending={"a": 4})
    c.max_activations = 1
    assert run_oracle(c) == "limit" == run_production(c)
