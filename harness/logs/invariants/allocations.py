"""Who holds which GPU, and what each pipeline registered: rebuilt from the log alone.

Several checks need the scheduler's state at some point of a log (ownership, the plan
conditions, the shape of grants, planned-release acks). None of them may ask the
scheduler model, whose correctness is what is being checked: this module replays the
*decision records* instead — a plan's ops applied at its cycle's ``commit`` (minus the
ops the commit says it skipped as stale), ``released`` records, and the ``register`` /
``unregister`` inputs for device mappings and TP sizes. Inconsistencies it meets (a
grant of a GPU someone else holds, a free of a GPU held by another cluster) are handed
to the caller, which decides whether they are its business.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Dict, List, Optional, Set, Tuple

GENERATION = "GENERATION"
GEN_SUFFIX = "_actor_infer"

Problem = Callable[[int, str], None]  # (seq, message)


def is_gen_cluster(cluster_id: str) -> bool:
    return cluster_id.endswith(GEN_SUFFIX)


@lru_cache(maxsize=4096)  # a run has a few clusters per pipeline; a 1024-GPU walk asks ~200 thousand times
def pipeline_of(cluster_id: str) -> str:
    """The pipeline id of a cluster id (cluster names never contain the separator's tail)."""
    for name in ("actor_train", "actor_infer", "critic", "reference"):
        if cluster_id.endswith("_" + name):
            return cluster_id[: -len(name) - 1]
    return cluster_id.rsplit("_", 1)[0]


@dataclass
class Registered:
    """One pipeline's registration as logged: mappings (sorted) and TP size per cluster."""

    mappings: Dict[str, List[int]]
    tps: Dict[str, int]

    def mapping(self, cluster_id: str) -> Optional[List[int]]:
        return self.mappings.get(cluster_id[len(pipeline_of(cluster_id)) + 1 :])

    def tp(self, cluster_id: str) -> Optional[int]:
        return self.tps.get(cluster_id[len(pipeline_of(cluster_id)) + 1 :])

    def bundle(self, cluster_id: str, dp_rank: int) -> Optional[List[int]]:
        m, tp = self.mapping(cluster_id), self.tp(cluster_id)
        if m is None or not tp:
            return None
        return m[dp_rank * tp : (dp_rank + 1) * tp]

    def max_dp(self, cluster_id: str) -> Optional[int]:
        m, tp = self.mapping(cluster_id), self.tp(cluster_id)
        return None if m is None or not tp else len(m) // tp

    def processes(self) -> int:
        """Worker processes of the pipeline: one per GPU of every cluster's mapping."""
        return sum(len(m) for m in self.mappings.values())


@dataclass
class Holdings:
    """GPU owner per GPU, GEN clusters' active DP ranks, and each allocation's priority."""

    num_gpus: Optional[int] = None
    owner: Dict[int, str] = field(default_factory=dict)
    ranks: Dict[str, Dict[int, List[int]]] = field(default_factory=dict)  # GEN cluster -> dp -> bundle
    priority: Dict[str, str] = field(default_factory=dict)  # cluster -> priority of its allocation
    registry: Dict[str, Registered] = field(default_factory=dict)
    # owner inverted (cluster -> its GPUs), kept with it by _own/_disown: "the GPUs of a
    # cluster" without scanning every GPU (8 000 grants x 1 024 GPUs in a 1024-GPU run)
    held_by: Dict[str, Set[int]] = field(default_factory=dict)

    def _own(self, g: int, cluster: str) -> None:
        before = self.owner.get(g)
        if before is not None:
            self.held_by[before].discard(g)
        self.owner[g] = cluster
        self.held_by.setdefault(cluster, set()).add(g)

    def _disown(self, g: int) -> None:
        self.held_by[self.owner.pop(g)].discard(g)

    def held(self, cluster_id: str) -> List[int]:
        return sorted(self.held_by.get(cluster_id, ()))

    # every GPU id, kept for idle(): a plan per cycle asks (8 800 x 1 024 GPUs in a 1024-GPU run)
    _every: Optional[Set[int]] = field(default=None, repr=False, compare=False)

    def idle(self) -> Set[int]:
        if self.num_gpus is None:
            return set()
        if self._every is None or len(self._every) != self.num_gpus:
            self._every = set(range(self.num_gpus))
        return self._every.difference(self.owner)

    def registration(self, cluster_id: str) -> Optional[Registered]:
        return self.registry.get(pipeline_of(cluster_id))

    # ------------------------------------------------------------------ mutations
    # free and grant are _own/_disown inlined (a grant's GPUs one by one, 60 thousand a
    # walk in a 1024-GPU run): the same steps, in order
    def free(self, seq: int, cluster: str, gpus, problem: Problem) -> None:
        owner, held_by = self.owner, self.held_by
        for g in gpus:
            held = owner.get(g)
            if held == cluster:
                held_by[owner.pop(g)].discard(g)
            elif held is not None:
                problem(seq, f"{cluster} frees GPU {g} held by {held}")

    def grant(self, seq: int, cluster: str, gpus, problem: Problem) -> None:
        owner, held_by, n = self.owner, self.held_by, self.num_gpus
        for g in gpus:
            if n is not None and not 0 <= g < n:
                problem(seq, f"{cluster} granted GPU {g} outside the cluster (0..{n - 1})")
            held = owner.get(g)
            if held is not None:
                if held != cluster:
                    problem(seq, f"GPU {g} granted to {cluster} while held by {held}")
                held_by[held].discard(g)
            owner[g] = cluster
            held_by.setdefault(cluster, set()).add(g)

    def release_cluster(self, seq: int, cluster: str, gpus, problem: Problem) -> None:
        self.free(seq, cluster, gpus, problem)
        self.ranks.pop(cluster, None)
        self.priority.pop(cluster, None)

    def apply_plan(self, plan: dict, commit: dict, problem: Problem) -> None:
        """RLix Phase 6 on this view: shrinks, then grants, then expands."""
        seq = commit["seq"]
        skipped = set(commit.get("skipped_stale", []))
        for s in plan["shrinks"]:
            cid = s["cluster_id"]
            for b in s["bundles"]:
                self.free(seq, cid, b["gpus"], problem)
                self.ranks.get(cid, {}).pop(b["dp_rank"], None)
        for s in plan["signals"]:
            cid = s["cluster_id"]
            if not s["gpus"] or f"grant {cid}" in skipped:
                continue
            mine = self.held_by.get(cid)
            if mine:  # a grant replaces the allocation (_disown of each of its GPUs)
                owner = self.owner
                for g in list(mine):
                    self.held_by[owner.pop(g)].discard(g)
            self.grant(seq, cid, s["gpus"], problem)
            self.priority[cid] = s["priority"]
            if is_gen_cluster(cid):
                reg = self.registration(cid)
                tp = (reg.tp(cid) if reg else None) or 1
                gpus = sorted(s["gpus"])
                self.ranks[cid] = {r: gpus[r * tp : (r + 1) * tp] for r in range(len(gpus) // tp)}
        for e in plan["expands"]:
            cid = e["cluster_id"]
            if f"expand {cid}" in skipped:
                continue
            for b in e["bundles"]:
                self.grant(seq, cid, b["gpus"], problem)
                self.ranks.setdefault(cid, {})[b["dp_rank"]] = list(b["gpus"])
            self.priority.setdefault(cid, GENERATION)


#: every kind :class:`DecisionWalk` reads (a check built on it ``sees`` them): the header
#: (the cluster's size) and the scheduler's registrations and decisions
DECISION_KINDS = ("header", "register", "rejected", "unregister", "plan", "commit", "released")


def _ignore(seq: int, message: str) -> None:
    pass


class DecisionWalk:
    """Walks a log keeping :class:`Holdings` current; subclasses' hooks see each record.

    ``on_record(r)`` is called for every record *before* the walk applies it, so a hook
    sees the state the record was decided in (a plan sees the holdings it was planned
    against); ``after_commit(plan, commit)`` runs once a cycle's plan is applied. The
    checks built on it share one walk of a log (harness/logs/invariants/decision_walks.py).
    """

    def __init__(self, records, problem: Problem = _ignore) -> None:
        self.records = records
        self.problem = problem
        self.h = Holdings()
        self.plans: Dict[int, dict] = {}
        self._undo: Dict[int, Tuple[str, Optional[Registered]]] = {}
        header = records[0] if records and records[0]["kind"] == "header" else None
        if header is not None:
            c = header["cluster"]
            self.h.num_gpus = c["nodes"] * c["gpus_per_node"]

    def on_record(self, r: dict) -> None:  # pragma: no cover - hook
        pass

    def after_commit(self, plan: dict, commit: dict) -> None:  # pragma: no cover - hook
        pass

    def missing_plan(self, commit: dict) -> None:
        self.problem(commit["seq"], f"commit of cycle {commit['cycle']} without a plan")

    def run(self) -> "DecisionWalk":
        # apply() acts on the decision kinds only: the rest (most of a view that also holds
        # rank states or effects) skip its tests, and a walk without its own on_record its call
        on_record, apply = self.on_record, self.apply
        hooked = type(self).on_record is not DecisionWalk.on_record
        acts = _APPLIED if type(self).apply is DecisionWalk.apply else None
        for r in self.records:
            if hooked:
                on_record(r)
            if acts is None or r["kind"] in acts:
                apply(r)
        return self

    def apply(self, r: dict) -> None:
        """One record's effect on the holdings (after ``on_record`` saw the state before it);
        a walk fed record by record calls ``on_record`` and this itself."""
        h = self.h
        k = r["kind"]
        if k == "register":
            pid = r["pipeline_id"]
            self._undo[r["seq"]] = (pid, h.registry.get(pid))
            h.registry[pid] = Registered(
                {name: sorted(m) for name, m in r["cluster_device_mappings"].items()}, dict(r["cluster_tp_configs"])
            )
        elif k == "rejected" and r["input_kind"] == "register" and r["input_seq"] in self._undo:
            pid, before = self._undo.pop(r["input_seq"])  # a refused registration changed nothing
            if before is None:
                h.registry.pop(pid, None)
            else:
                h.registry[pid] = before
        elif k == "unregister":
            h.registry.pop(r["pipeline_id"], None)
        elif k == "plan":
            self.plans[r["cycle"]] = r
        elif k == "commit":
            plan = self.plans.pop(r["cycle"], None)
            if plan is None:
                self.missing_plan(r)
                return
            h.apply_plan(plan, r, self.problem)
            self.after_commit(plan, r)
        elif k == "released":
            h.release_cluster(r["seq"], r["cluster_id"], r["gpus"], self.problem)


#: the kinds :meth:`DecisionWalk.apply` changes anything for
_APPLIED = frozenset(("register", "rejected", "unregister", "plan", "commit", "released"))


def bundle_key(b: dict) -> Tuple[int, Tuple[int, ...]]:
    return b["dp_rank"], tuple(b["gpus"])
