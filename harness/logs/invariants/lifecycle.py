"""Inference-rank invariants read from the runtime records: 22 (nothing in flight at sleep
or stop), 23 (sync targets) and 24 (rank lifecycle transitions).

The lifecycle is RLix's engine order (``rlix/pipeline/coordinator.py`` ``resize_infer``
and NeMo RL ``nemo_rl/models/generation/vllm/vllm_generation.py`` sleep/wake, rlops/rlix
and NVIDIA-NeMo/RL): a rank is woken, synced from the CPU bucket cache, finalized and only
then activated (routable); a shrink aborts its in-flight requests, drains, and only then
sleeps. The edges are written out here from that order, not imported from the control
logic (``harness/control/rank_state.py``) they judge.
"""

from __future__ import annotations

from typing import Dict, List, Set, Tuple

from harness.logs.invariants.allocations import DECISION_KINDS, DecisionWalk
from harness.logs.invariants.base import Records, Violation, invariant
from harness.logs.invariants.decision_walks import walk_check

#: state -> states it may enter next (any state may enter ``stopped``; ``stopped`` is final)
EDGES = {
    "asleep": {"waking"},
    "waking": {"awake_unrouted"},
    "awake_unrouted": {"synced", "draining"},
    "synced": {"synced", "routable", "draining"},
    "routable": {"routable", "draining"},
    "draining": {"asleep"},
    "stopped": set(),
}
INITIAL = "asleep"  # an engine is created asleep (RLix: offloaded after init)

Rank = Tuple[str, int]


@invariant("rank_lifecycle", reads=("rank_state",))
def rank_lifecycle(records: Records) -> List[Violation]:
    """``rank_lifecycle``: each ``rank_state`` record is an edge of the lifecycle from the rank's
    previous state (asleep before its first record)."""
    out: List[Violation] = []
    state: Dict[Rank, str] = {}
    for r in records:
        if r["kind"] != "rank_state":
            continue
        key, new = (r["pipeline_id"], r["dp_rank"]), r["state"]
        old = state.get(key, INITIAL)
        allowed = EDGES.get(old, set()) | ({"stopped"} if old != "stopped" else set())
        if new not in allowed:
            out.append(
                Violation(
                    "rank_lifecycle",
                    r["seq"],
                    f"{key[0]} dp{key[1]} went {old} -> {new}; "
                    f"from {old} the lifecycle allows only {sorted(allowed) or 'nothing (final)'}",
                )
            )
        state[key] = new
    return out


@invariant(
    "in_flight_at_sleep",
    reads=("rank_state", "unregister", "request_dispatch", "request_done", "request_abort", "request_failed"),
    sees=("request_pause", "request_resume"),
)
def in_flight_at_sleep(records: Records) -> List[Violation]:
    """``in_flight_at_sleep``: a rank enters ``asleep`` (or ``stopped``), and a pipeline unregisters,
    only with no request dispatched to it still running (abort -> drain -> sleep). A
    request a keep pause froze (``request_pause``) is not running until its
    ``request_resume``; a kept one is still counted at the unregister (nobody resumes it)."""
    out: List[Violation] = []
    running: Dict[Rank, Set[int]] = {}
    where: Dict[Tuple[str, int], int] = {}  # (pipeline, request) -> rank it runs on
    kept: Set[Tuple[str, int]] = set()  # (pipeline, request) frozen by a keep pause
    for r in records:  # (a dispatch and a completion, most of the records, without a throwaway set each)
        k = r["kind"]
        if k == "request_dispatch":
            pid, req, dp = r["pipeline_id"], r["request"], r["dp_rank"]
            on = running.get((pid, dp))
            if on is None:
                running[(pid, dp)] = {req}
            else:
                on.add(req)
            where[(pid, req)] = dp
        elif k in ("request_done", "request_abort", "request_failed"):
            pid, req = r["pipeline_id"], r["request"]
            key = (pid, req)
            dp = where.pop(key, r.get("dp_rank"))
            on = running.get((pid, dp))
            if on is not None:
                on.discard(req)
            if kept:
                kept.discard(key)
        elif k == "request_pause":  # frozen in the engine: not running while the rank sleeps
            running.get((r["pipeline_id"], r["dp_rank"]), set()).discard(r["request"])
            kept.add((r["pipeline_id"], r["request"]))
        elif k == "request_resume":
            kept.discard((r["pipeline_id"], r["request"]))
            running.setdefault((r["pipeline_id"], r["dp_rank"]), set()).add(r["request"])
        elif k == "rank_state" and r["state"] in ("asleep", "stopped"):
            key = (r["pipeline_id"], r["dp_rank"])
            left = running.get(key)
            if left:
                out.append(
                    Violation(
                        "in_flight_at_sleep",
                        r["seq"],
                        f"{key[0]} dp{key[1]} went {r['state']} with "
                        f"{len(left)} request(s) still running on it, e.g. {sorted(left)[:3]}",
                    )
                )
                left.clear()
        elif k == "unregister":
            pid = r["pipeline_id"]
            left = sorted((dp, req) for (p, dp), reqs in running.items() if p == pid for req in reqs)
            if left:
                out.append(
                    Violation(
                        "in_flight_at_sleep",
                        r["seq"],
                        f"{pid} unregistered with {len(left)} request(s) "
                        f"still running, e.g. dp{left[0][0]} request {left[0][1]}",
                    )
                )
                for (p, _), reqs in running.items():
                    if p == pid:
                        reqs.clear()
    return out


class _SyncTargets(DecisionWalk):
    """Walks decisions (holdings, plans) and the sync records side by side."""

    def __init__(self, records) -> None:
        super().__init__(records)
        self.out: List[Violation] = []
        self.state: Dict[Rank, str] = {}
        self.open: Dict[str, dict] = {}  # pipeline -> its open SyncFromCache start (one at a time: coordinator lock)
        self.cycle_plans: Dict[int, dict] = {}

    def on_record(self, r: dict) -> None:
        k = r["kind"]
        if k == "plan":
            self.cycle_plans[r["cycle"]] = r
        elif k == "rank_state":
            self.state[(r["pipeline_id"], r["dp_rank"])] = r["state"]
        elif k == "effect_start" and r["effect"] == "SyncFromCache":
            self.open[r["pipeline_id"]] = r
        elif k == "effect_end" and r["effect"] == "SyncFromCache":
            self.open.pop(r["pipeline_id"], None)
        elif k == "sync_bucket" and r.get("pipeline_id") in self.open:
            self._bucket(r)

    def _bucket(self, r: dict) -> None:
        pid = r["pipeline_id"]
        start = self.open[pid]
        path = start["args"].get("path", "expand")  # expand | active (the bucket's own path is ipc|broadcast)
        state = self.state
        if path == "active":
            for dp in r["dp_ranks"]:
                st = state.get((pid, dp), "asleep")
                if st != "routable":
                    self._bad(r, f"active refresh of {pid} writes dp{dp}, which is {st}, not routable")
            return
        for dp in r["dp_ranks"]:
            st = state.get((pid, dp), "asleep")
            if st not in ("awake_unrouted", "synced"):
                self._bad(r, f"expand sync of {pid} writes dp{dp}, which is {st}, not awake")
        plan = self.cycle_plans.get(start.get("cycle"))
        if plan is None:
            return  # a sync outside a scheduler cycle (a gate, or an init sync): no expand to compare
        cid = f"{pid}_actor_infer"
        op = next((e for e in plan["expands"] if e["cluster_id"] == cid), None)
        bundles = {b["dp_rank"]: b["gpus"] for b in (op["bundles"] if op else [])}
        held = self.h.held_by.get(cid, set())
        reg = self.h.registry.get(pid)
        for dp in r["dp_ranks"]:
            if dp not in bundles:
                self._bad(
                    r,
                    f"expand sync of {pid} (cycle {plan['cycle']}) writes dp{dp}, which that expand does "
                    f"not add (it adds {sorted(bundles)})",
                )
                continue
            gpus = (reg.bundle(cid, dp) if reg else None) or bundles[dp]
            foreign = [g for g in gpus if g not in held and g not in bundles[dp]]
            if foreign:
                self._bad(r, f"expand sync of {pid} writes dp{dp} on GPU(s) {foreign}, which {cid} does not hold")

    def _bad(self, r: dict, message: str) -> None:
        self.out.append(Violation("sync_targets", r["seq"], message))


sync_targets = invariant(
    "sync_targets", reads=("sync_bucket",), sees=DECISION_KINDS + ("rank_state", "effect_start", "effect_end")
)(
    walk_check(
        "sync_targets",
        _SyncTargets,
        # only SyncFromCache among the effects matters: the rest never reach the (slower) hook
        keep=lambda r: r["kind"][:7] != "effect_" or r["effect"] == "SyncFromCache",
        doc="""``sync_targets``: an expand's weight sync writes only the ranks that expand adds, awake,
    on GPUs their cluster holds or is being given; an active refresh writes only routable
    ranks.""",
    )
)
