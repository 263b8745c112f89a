"""Scheduler-decision invariants re-derived from the log: 21 (grant order) and 26 (waste).

RLix's Phase 2 (``rlix/scheduler/scheduler.py``, ``_plan_non_generation``; reference:
rlops/rlix) walks the pending non-GENERATION requests tier by tier
(INITIALIZATION first, VALUE_COMPUTE last), FIFO inside a tier, and grants each one whose
whole device mapping is free or held only by GENERATION ranks it may preempt. A request
that cannot be granted is skipped (later ones overtake it) unless the header's scheduler
options set ``head_of_line_blocking``, which stops granting for the rest of the cycle.

A scheduling policy other than RLix's (docs/policies.md) changes two of these rules, and
says so in the header (``scheduler.policy``; :mod:`harness.logs.invariants.policy_rules`): under
``acquire_yield`` GPUs another pipeline's GENERATION holds are not obtainable for a
non-GENERATION request, and ``idle_bundle_starvation`` counts only the bundles the policy
lets the waiting pipeline take. Nothing else is exempted.

Both checks rebuild the scheduler's view from decision records only
(:class:`harness.logs.invariants.allocations.DecisionWalk`): who holds each GPU at plan time,
which requests are pending (``enqueued`` until ``signalled``), the registered device
mappings; the model that wrote the plan is never asked.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from harness.logs.invariants.allocations import DECISION_KINDS, GENERATION, DecisionWalk, pipeline_of
from harness.logs.invariants.base import Violation, invariant
from harness.logs.invariants.decision_walks import walk_check
from harness.logs.invariants.policy_rules import group_mates, header_policy, parts

#: RLix's priority order (lower first); GENERATION (6) is elastic and never granted here
TIERS = {
    "INITIALIZATION": 0,
    "ACTOR_TRAINING": 1,
    "CRITIC_TRAINING": 2,
    "OLD_LOG_PROBS": 3,
    "REF_LOG_PROBS": 4,
    "VALUE_COMPUTE": 5,
    "GENERATION": 6,
}


def tier(priority) -> int:
    return TIERS[priority] if isinstance(priority, str) else int(priority)


class _Pending(DecisionWalk):
    """A decision walk that also keeps the pending requests (``enqueued`` until
    ``signalled``) and the same-cluster reservations of ``reserve_same_cluster_release``."""

    def __init__(self, records) -> None:
        super().__init__(records)
        header = records[0] if records and records[0]["kind"] == "header" else {}
        self.options = dict(header.get("scheduler") or {})
        self.policy = header_policy(records)
        self.pending: Dict[int, Tuple[int, int, str]] = {}  # request_id -> (tier, seq, cluster)
        self.held_for: Dict[str, Set[int]] = {}
        self._last_rtr: Optional[dict] = None
        self._last_released: Dict[str, List[int]] = {}

    def on_record(self, r: dict) -> None:
        k = r["kind"]
        if k == "enqueued":
            self.pending[r["request_id"]] = (tier(r["priority"]), r["seq"], r["cluster_id"])
            rtr = self._last_rtr
            if (
                rtr is not None
                and self.options.get("reserve_same_cluster_release")
                and rtr["release_cluster_id"] == rtr["request_cluster_id"] == r["cluster_id"]
            ):
                self.held_for[r["cluster_id"]] = set(self._last_released.get(r["cluster_id"], ()))
            self._last_rtr = None
        elif k == "signalled" and r["waiter"] == "request":
            self.pending.pop(r["request_id"], None)
            self.held_for.pop(r["cluster_id"], None)
        elif k == "release_then_request":
            self._last_rtr = r
        elif k == "released":
            self._last_released[r["cluster_id"]] = list(r["gpus"])
        elif k == "unregister":
            for cid in [c for c in self.held_for if pipeline_of(c) == r["pipeline_id"]]:
                del self.held_for[cid]
        elif k == "plan":
            self.on_plan(r)

    def on_plan(self, plan: dict) -> None:  # pragma: no cover - hook
        pass

    def obtainable(self) -> Set[int]:
        """GPUs a non-GENERATION grant may take at plan time: idle or held by GENERATION."""
        h = self.h
        if h.num_gpus is None:
            return set()
        out = set(range(h.num_gpus))
        priority = h.priority
        # by cluster (held_by: the owners inverted), not GPU by GPU: a plan of a 1024-GPU run
        # otherwise walks every GPU's owner
        for cid, gpus in h.held_by.items():
            if gpus and priority.get(cid, GENERATION) != GENERATION:
                out -= gpus
        return out

    def not_obtainable_for(self, cid: str) -> Set[int]:
        """GPUs of :meth:`obtainable` that ``cid``'s request still may not take: under
        acquire_yield (a policy parameter in the header) those another pipeline's
        GENERATION holds for its phase; none under every other policy."""
        if self.policy["policy"] != "acquire_yield":
            return set()
        mine = pipeline_of(cid)
        return {
            g
            for g, owner in self.h.owner.items()
            if self.h.priority.get(owner, GENERATION) == GENERATION and pipeline_of(owner) != mine
        }


class _GrantOrder(_Pending):
    def __init__(self, records) -> None:
        super().__init__(records)
        self.out: List[Violation] = []

    def on_plan(self, plan: dict) -> None:
        granted = {
            s["cluster_id"]: set(s["gpus"])
            for s in plan["signals"]
            if s["gpus"] and tier(s["priority"]) < TIERS["GENERATION"]
        }
        if not granted:
            return
        hol = bool(self.options.get("head_of_line_blocking"))
        free = self.obtainable()
        for gpus in self.held_for.values():
            free -= gpus
        passed_over: List[Tuple[str, str]] = []  # (cluster, why) of earlier requests left waiting
        for t, _, cid in sorted(v for v in self.pending.values() if v[0] < TIERS["GENERATION"]):
            reg = self.h.registration(cid)
            mapping = reg.mapping(cid) if reg is not None else None
            if cid in self.h.priority or mapping is None:
                continue  # already holds an allocation, or not registered: RLix skips it
            if cid in granted:
                for before, why in passed_over:
                    self.out.append(
                        Violation(
                            "grant_order",
                            plan["seq"],
                            f"cycle {plan['cycle']} grants {cid} GPUs {sorted(granted[cid])} after "
                            f"passing over the earlier {before}, {why}",
                        )
                    )
                passed_over.clear()
                free -= granted[cid]
                continue
            barred = self.not_obtainable_for(cid)
            usable = (free - barred if barred else free) | self.held_for.get(cid, set())
            if set(mapping) <= usable:
                passed_over.append((cid, f"whose whole mapping {mapping} was idle or held by GENERATION"))
            elif hol:
                passed_over.append((cid, "which could not be granted, and head_of_line_blocking is on"))


grant_order = invariant(
    "grant_order", reads=("plan", "enqueued", "signalled"), sees=DECISION_KINDS + ("release_then_request",)
)(
    walk_check(
        "grant_order",
        _GrantOrder,
        doc="""``grant_order``: a non-GENERATION grant never overtakes an earlier pending request
    (lower tier number, or same tier and enqueued first) that those decisions left
    grantable, nor — under ``head_of_line_blocking`` — one that was blocked.""",
    )
)


class _Waste(_Pending):
    """``ungrantable_preemption``: GENERATION ranks shrunk for a non-GENERATION request that
    the same plan does not grant (RLix Phase 2 keeps such shrinks unless
    ``rollback_ungrantable_preemption``; rlix.md's "GEN shrink for a non-GEN request that
    still cannot be granted"), and the thrash that follows (the rank re-expanded and shrunk
    again for the same still-waiting request)."""

    def __init__(self, records) -> None:
        super().__init__(records)
        self.out: List[Violation] = []
        self.planned: Dict[str, Set[int]] = {}  # GEN cluster -> dp ranks of its planned release
        self.times: Dict[Tuple[str, int, int], int] = {}  # (cluster, dp, request) -> wasted shrinks

    def on_record(self, r: dict) -> None:
        k = r["kind"]
        if k == "release_pending":
            self.planned.setdefault(r["cluster_id"], set()).update(r["dp_ranks"])
        elif k == "signalled" and r["waiter"] == "planned_release":
            self.planned.pop(r["cluster_id"], None)
        super().on_record(r)

    def on_plan(self, plan: dict) -> None:
        if not plan["shrinks"]:
            return
        used: Set[int] = set()
        granted = set()
        for s in plan["signals"]:
            used.update(s["gpus"])
            granted.add(s["cluster_id"])
        for e in plan["expands"]:
            for b in e["bundles"]:
                used.update(b["gpus"])
        waiting = []  # (request, cluster, mapping) of the non-GEN requests this plan leaves waiting
        for rid, (t, _, cid) in sorted(self.pending.items(), key=lambda kv: kv[1]):
            reg = self.h.registration(cid)
            mapping = reg.mapping(cid) if reg is not None else None
            if t < TIERS["GENERATION"] and mapping and cid not in granted and cid not in self.h.priority:
                waiting.append((rid, cid, set(mapping)))
        for op in plan["shrinks"]:
            cid = op["cluster_id"]
            for b in op["bundles"]:
                gpus = set(b["gpus"])
                if b["dp_rank"] in self.planned.get(cid, ()) or gpus & used:
                    continue
                rid, wanted = next(((i, c) for i, c, m in waiting if m & gpus), (None, None))
                if rid is None:
                    continue
                key = (cid, b["dp_rank"], rid)
                n = self.times[key] = self.times.get(key, 0) + 1
                what = (
                    f"cycle {plan['cycle']} shrinks {cid} dp{b['dp_rank']} (GPUs {sorted(gpus)}) for {wanted} "
                    f"(request {rid}), which the cycle does not grant: the GPUs idle"
                )
                if n > 1:
                    what += f"; thrash: shrunk {n} times for that still-waiting request"
                self.out.append(Violation("ungrantable_preemption", plan["seq"], what))


ungrantable_preemption = invariant(
    "ungrantable_preemption",
    reads=("plan",),
    sees=DECISION_KINDS + ("enqueued", "signalled", "release_pending", "release_then_request"),
)(
    walk_check(
        "ungrantable_preemption",
        _Waste,
        doc="""``ungrantable_preemption``: no GENERATION rank is shrunk for a request its cycle does not grant
    (scheduler waste), nor shrunk again and again for the same waiting request (thrash).""",
    )
)


#: how long a pipeline may wait for its batch with no routable rank while a whole TP bundle
#: of its inference mapping idles, where the log's header does not say (a gate's or an
#: imported log). A simulator log carries a bound per pipeline (``meta.idle_bundle_bound_s``:
#: the scenario's ``costs.idle_bundle_bound_s``, or twice the polls, wake and sync a healthy
#: scheduler needs to hand a bundle over, simulators/runtime/timeouts.py); the field report of
#: rlix.md §8 (one-shot GENERATION starving after preemption) idled ~90 s.
IDLE_BUNDLE_BOUND_S = 60.0


class _IdleBundle(DecisionWalk):
    """``idle_bundle_starvation``: a pipeline starved while a bundle it could use idles."""

    def __init__(self, records) -> None:
        super().__init__(records)
        self.policy = header_policy(records)
        head = records[0] if records and records[0].get("kind") == "header" else {}
        self.bounds: Dict[str, float] = dict((head.get("meta") or {}).get("idle_bundle_bound_s") or {})
        self.ever: Dict[str, object] = {}  # every registration seen, first-registration order
        self.out: List[Violation] = []
        self.waiting: Dict[str, bool] = {}
        self.routable: Dict[str, Set[int]] = {}
        self.since: Dict[str, Tuple[float, List[int]]] = {}  # pid -> (t starved since, idle bundle)
        self.reported: Set[str] = set()
        self.dirty: Set[str] = set()
        self.holdings_changed = False
        self.last_t = 0.0

    def _idle_bundle(self, pid: str, idle: Set[int]) -> Optional[List[int]]:
        """An idle bundle the header's policy lets ``pid`` take (policy_rules), or None."""
        reg = self.h.registry.get(pid)
        cid = f"{pid}_actor_infer"
        if reg is None or reg.max_dp(cid) is None:
            return None
        policy = self.policy["policy"]
        for q, r in self.h.registry.items():  # parts and groups are drawn over every pipeline ever registered
            self.ever[q] = r
        if policy == "static_partition":
            idle = idle & parts(self.ever, self.policy["partition"]).get(pid, set())
        elif policy == "acquire_yield" and not idle.issuperset(reg.mapping(cid)):
            return None  # it acquires its whole mapping or nothing
        elif policy == "round_robin" and any(
            self.h.held(f"{q}_actor_infer") for q in group_mates(self.ever, self.policy["groups"], pid)
        ):
            return None  # another member of its co-execution group holds the rollout turn
        for dp in range(reg.max_dp(cid)):
            b = reg.bundle(cid, dp)
            if b and idle.issuperset(b):
                return b
        return None

    def _refresh(self) -> None:
        if not self.dirty and not self.holdings_changed:
            return
        if not self.holdings_changed and not any(
            self.waiting.get(pid) and not self.routable.get(pid) for pid in self.dirty
        ):  # (most calls: a rank of a pipeline not starved moved) what the general path does then
            for pid in self.dirty:
                self.since.pop(pid, None)
                self.reported.discard(pid)
            self.dirty.clear()
            return
        pids = set(self.dirty)
        if self.holdings_changed:
            pids |= {p for p, w in self.waiting.items() if w}
        starved = {pid for pid in pids if self.waiting.get(pid) and not self.routable.get(pid)}
        idle = self.h.idle() if starved else set()  # a set difference over every GPU: only when needed
        for pid in pids:
            bundle = self._idle_bundle(pid, idle) if pid in starved else None
            if bundle is None:
                self.since.pop(pid, None)
                self.reported.discard(pid)
            elif pid not in self.since:
                self.since[pid] = (self.last_t, bundle)
        self.dirty.clear()
        self.holdings_changed = False

    def on_record(self, r: dict) -> None:
        self._refresh()
        now = r["t"]
        for pid, (t0, bundle) in self.since.items() if self.since else ():
            bound = self.bounds.get(pid, IDLE_BUNDLE_BOUND_S)
            if pid not in self.reported and now - t0 > bound:
                self.reported.add(pid)
                self.out.append(
                    Violation(
                        "idle_bundle_starvation",
                        r["seq"],
                        f"{pid} has waited for its batch with no routable rank since t={t0:.1f} s "
                        f"while GPUs {bundle} (a whole bundle of its inference mapping) idle: more "
                        f"than {bound:g} s",
                    )
                )
        k = r["kind"]
        if k == "effect_start" or k == "effect_end":
            if r["effect"] == "WaitBatch":
                self.waiting[r["pipeline_id"]] = k == "effect_start"
                self.dirty.add(r["pipeline_id"])
        elif k == "rank_state":
            ranks = self.routable.setdefault(r["pipeline_id"], set())
            (ranks.add if r["state"] == "routable" else ranks.discard)(r["dp_rank"])
            self.dirty.add(r["pipeline_id"])
        elif k == "commit" or k == "released" or k == "register" or k == "unregister":
            self.holdings_changed = True
            if k == "unregister":
                self.waiting.pop(r["pipeline_id"], None)
                self.dirty.add(r["pipeline_id"])
        self.last_t = now


idle_bundle_starvation = invariant(
    "idle_bundle_starvation", reads=("effect_start", "effect_end", "rank_state"), sees=DECISION_KINDS
)(
    walk_check(
        "idle_bundle_starvation",
        _IdleBundle,
        # only WaitBatch among the effects matters: the rest never reach the (slower) hook
        keep=lambda r: r["kind"][:7] != "effect_" or r["effect"] == "WaitBatch",
        doc="""``idle_bundle_starvation``: no pipeline waits for its batch with no routable rank for longer than
    its bound (the header's ``meta.idle_bundle_bound_s``, else :data:`IDLE_BUNDLE_BOUND_S`)
    while a whole TP bundle of its inference mapping is idle.""",
    )
)
