"""Plan invariants re-derived from the log: the 11 plan-validation conditions
(``plan_validation``) and the shape of grants (``grant_shape``).

The scheduler model validates its own plans (``harness/scheduler/validation.py``); these
checks do not call it. Each ``plan`` record is judged against the state the log itself
implies at that point — holdings rebuilt from earlier decisions and the registrations
logged as ``register`` inputs (:mod:`harness.logs.invariants.allocations`) — so a plan that a
faulty validator let through, or a log from another implementation, is caught.
Conditions that need a registration (device mappings, TP sizes) are skipped for a
pipeline whose ``register`` is not in the log (a decisions-only replay output).
"""

from __future__ import annotations

from collections import Counter
from typing import List, Set, Tuple

from harness.logs.invariants.allocations import DECISION_KINDS, GENERATION, DecisionWalk, Holdings, is_gen_cluster
from harness.logs.invariants.base import Violation, invariant
from harness.logs.invariants.decision_walks import walk_check


def validate_plan(plan: dict, h: Holdings) -> List[Tuple[int, str]]:
    """(condition, message) for every RLix plan-validation condition ``plan`` breaks."""
    bad: List[Tuple[int, str]] = []
    shrinks, signals, expands = plan["shrinks"], plan["signals"], plan["expands"]
    if not (shrinks or signals or expands):
        # every condition is about an op: an empty plan (most cycles of a long run) breaks
        # none, and the idle set below costs a pass over every GPU of the cluster
        return bad
    _check_op_lists(shrinks, signals, expands, h, bad)
    grants = _Grants(h, _check_shrinks(shrinks, h, bad), bad)
    _check_grants(signals, h, grants, bad)
    _check_expands(expands, shrinks, h, grants, bad)
    return bad


def _check_op_lists(shrinks: list, signals: list, expands: list, h: Holdings, bad: List[Tuple[int, str]]) -> None:
    """Conditions 1, 2, 3 and 11: which clusters the ops may name."""
    # 1: a cluster appears at most once per op list
    for label, ops in (("shrink", shrinks), ("signal", signals), ("expand", expands)):
        for cid, n in sorted(Counter(op["cluster_id"] for op in ops).items()):
            if n > 1:
                bad.append((1, f"{cid} appears {n} times among the {label} ops"))
    # 2: shrinks and expands target GENERATION clusters whose allocation is GENERATION
    for label, ops in (("shrink", shrinks), ("expand", expands)):
        for op in ops:
            cid = op["cluster_id"]
            prio = h.priority.get(cid)
            if not is_gen_cluster(cid):
                bad.append((2, f"{label} of {cid}, which is not a GENERATION cluster"))
            elif prio is not None and prio != GENERATION:
                bad.append((2, f"{label} of {cid}, whose allocation is at {prio}"))
    # 3: no cluster both granted and shrunk in one plan (the plan's only form of removal)
    shrunk_clusters = {op["cluster_id"] for op in shrinks}
    for op in signals:
        if op["gpus"] and op["cluster_id"] in shrunk_clusters:
            bad.append((3, f"{op['cluster_id']} is both granted and shrunk"))
    # 11: a shrunk cluster must have an allocation
    for op in shrinks:
        if op["cluster_id"] not in h.priority:
            bad.append((11, f"shrink of {op['cluster_id']}, which has no allocation"))


def _check_shrinks(shrinks: list, h: Holdings, bad: List[Tuple[int, str]]) -> Set[int]:
    """Conditions 5, 6 (shrink side) and 9: shrinks remove active ranks that have bundles,
    each GPU freed once. Returns the GPUs the plan may grant: idle, or freed by a shrink."""
    available: Set[int] = h.idle()
    freed: Set[int] = set()
    for op in shrinks:
        cid = op["cluster_id"]
        active = h.ranks.get(cid, {})
        for b in op["bundles"]:
            if cid in h.priority and b["dp_rank"] not in active:
                bad.append((5, f"shrink of {cid} dp{b['dp_rank']}, which is not active"))
            if not b["gpus"]:
                bad.append((6, f"shrink of {cid} dp{b['dp_rank']} without a GPU bundle"))
            for g in b["gpus"]:
                if g in freed:
                    bad.append((9, f"GPU {g} freed twice"))
                freed.add(g)
                if h.owner.get(g) == cid:
                    available.add(g)
    return available


class _Grants:
    """The GPUs a plan's grants and expands take, in plan order: conditions 4, 6, 8 and 10
    on each GPU as it is taken."""

    def __init__(self, h: Holdings, available: Set[int], bad: List[Tuple[int, str]]) -> None:
        self.h, self.available, self.bad = h, available, bad
        self.num_gpus = h.num_gpus
        self.granted: Set[int] = set()

    def consume(self, gpus, what: str) -> None:
        bad, num_gpus, granted, available = self.bad, self.num_gpus, self.granted, self.available
        if len(set(gpus)) != len(gpus):
            bad.append((6, f"{what} names a GPU twice: {gpus}"))
        for g in gpus:
            if num_gpus is not None and not 0 <= g < num_gpus:
                bad.append((8, f"{what} names GPU {g}, outside the cluster (0..{num_gpus - 1})"))
            elif g in granted:
                bad.append((10, f"GPU {g} given to two allocations by one plan ({what})"))
            elif g not in available:
                holder = self.h.owner.get(g)
                bad.append((4, f"{what} takes GPU {g}, which is not idle (held by {holder})"))
            granted.add(g)
            available.discard(g)


def _check_grants(signals: list, h: Holdings, grants: _Grants, bad: List[Tuple[int, str]]) -> None:
    """Conditions 4, 6, 8 and 10 for grants: they take only idle GPUs inside their device mapping."""
    for op in signals:
        cid, gpus = op["cluster_id"], op["gpus"]
        if not gpus:
            continue
        grants.consume(gpus, f"grant of {cid}")
        reg = h.registration(cid)
        mapping = reg.mapping(cid) if reg else None
        if mapping is not None and not set(gpus) <= set(mapping):
            bad.append((6, f"grant of {cid} {sorted(gpus)} outside its device mapping {mapping}"))


def _check_expands(expands: list, shrinks: list, h: Holdings, grants: _Grants, bad: List[Tuple[int, str]]) -> None:
    """Conditions 5, 6, 7 and 10 for expands: they add inactive ranks, one TP bundle each, below max DP."""
    shrunk_ranks = {(op["cluster_id"], b["dp_rank"]) for op in shrinks for b in op["bundles"]}
    for op in expands:
        cid = op["cluster_id"]
        # RLix simulates shrinks first: a rank shrunk by this plan counts as inactive here
        # (re-adding it is no_readd_in_cycle's finding, RLix's Phase 5 check)
        active = {r: b for r, b in h.ranks.get(cid, {}).items() if (cid, r) not in shrunk_ranks}
        reg = h.registration(cid)
        tp, max_dp = (reg.tp(cid), reg.max_dp(cid)) if reg else (None, None)
        added = [b["dp_rank"] for b in op["bundles"]]
        for b in op["bundles"]:
            r = b["dp_rank"]
            if r in active:
                bad.append((5, f"expand of {cid} dp{r}, which is already active"))
            if tp is not None and len(b["gpus"]) != tp:
                bad.append((6, f"expand of {cid} dp{r} with {len(b['gpus'])} GPU(s), tp is {tp}"))
            if max_dp is not None and not 0 <= r < max_dp:
                bad.append((7, f"expand of {cid} dp{r}: max DP is {max_dp}"))
            grants.consume(b["gpus"], f"expand of {cid} dp{r}")
        if len(added) != len(set(added)):
            bad.append((10, f"expand of {cid} adds a dp rank twice: {added}"))
        if max_dp is not None and len(set(active) | set(added)) > max_dp:
            bad.append((7, f"{cid} would have {len(set(active) | set(added))} active ranks, max DP is {max_dp}"))


class _PlanWalk(DecisionWalk):
    """A walk that judges each plan against the holdings it was planned on."""

    def __init__(self, records) -> None:
        super().__init__(records)
        self.out: List[Violation] = []

    def on_record(self, r: dict) -> None:
        if r["kind"] == "plan":
            self.judge(r)

    def judge(self, r: dict) -> None:  # pragma: no cover - hook
        pass


class _Validation(_PlanWalk):
    def judge(self, r: dict) -> None:
        for cond, msg in validate_plan(r, self.h):
            self.out.append(Violation("plan_validation", r["seq"], f"cycle {r['cycle']}: condition {cond}: {msg}"))


plan_validation = invariant("plan_validation", reads=("plan",), sees=DECISION_KINDS)(
    walk_check(
        "plan_validation",
        _Validation,
        doc="""``plan_validation``: every plan satisfies RLix's 11 plan-validation conditions.""",
    )
)


class _GrantShape(_PlanWalk):
    def judge(self, r: dict) -> None:
        out = self.out
        c = r["cycle"]
        for op in r["signals"]:
            cid, gpus = op["cluster_id"], op["gpus"]
            reg = self.h.registration(cid)
            mapping = reg.mapping(cid) if reg else None
            if gpus and op["priority"] != GENERATION and mapping is not None and sorted(gpus) != mapping:
                out.append(
                    Violation(
                        "grant_shape",
                        r["seq"],
                        f"cycle {c}: {op['priority']} grant of {cid} is {sorted(gpus)}, not its whole device mapping {mapping}",
                    )
                )
        for op in r["expands"]:
            cid = op["cluster_id"]
            reg = self.h.registration(cid)
            if reg is None:
                continue
            max_dp = reg.max_dp(cid)
            for b in op["bundles"]:
                want = reg.bundle(cid, b["dp_rank"])
                if max_dp is not None and b["dp_rank"] >= max_dp:
                    out.append(
                        Violation(
                            "grant_shape",
                            r["seq"],
                            f"cycle {c}: {cid} dp{b['dp_rank']} is not below max DP {max_dp}",
                        )
                    )
                elif want is not None and sorted(b["gpus"]) != want:
                    out.append(
                        Violation(
                            "grant_shape",
                            r["seq"],
                            f"cycle {c}: {cid} dp{b['dp_rank']} granted {sorted(b['gpus'])}, its TP bundle is {want}",
                        )
                    )


grant_shape = invariant("grant_shape", reads=("plan",), sees=DECISION_KINDS)(
    walk_check(
        "grant_shape",
        _GrantShape,
        doc="""``grant_shape``: a non-GENERATION grant is the cluster's whole device mapping; a
    GENERATION expand adds whole TP bundles — dp rank r is exactly
    ``sorted(mapping)[r*tp:(r+1)*tp]`` — below max DP.""",
    )
)
