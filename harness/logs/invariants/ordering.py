"""Ordering invariants: resize order (``resize_order``), no remove-and-re-add
(``no_readd_in_cycle``), activation only after sync + finalize + publish
(``activate_after_sync``), actor_train released only after refresh + publish
(``release_after_publish``), and one training step after another (``step_order``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

from harness.logs.invariants.allocations import DECISION_KINDS, DecisionWalk
from harness.logs.invariants.base import Records, Violation, invariant
from harness.logs.invariants.decision_walks import walk_check


@dataclass
class CycleMarks:
    """The times T1 < T2 < T3 are about, per cycle (None: the cycle had no such record)."""

    t1: Optional[float] = None  # the last shrink of the cycle returned
    t2: Optional[float] = None  # the first expand of the cycle started
    t3: Optional[float] = None  # the first waiter of the cycle was signalled


def resize_walk(records: Records) -> Tuple[List[Violation], Dict[int, CycleMarks]]:
    """The ``resize_order`` check and, per cycle, its T1/T2/T3 (a gate's report shows them)."""
    out: List[Violation] = []
    marks: Dict[int, CycleMarks] = {}
    first_expand_start: Dict[int, int] = {}
    open_calls: Dict[Tuple[int, str, str], int] = {}
    for r in records:
        k = r["kind"]
        if k in ("resize_start", "resize_end"):
            c, key = r["cycle"], (r["cycle"], r["pipeline_id"], r["phase"])
            m = marks.setdefault(c, CycleMarks())
            if k == "resize_start":
                open_calls[key] = r["seq"]
                if r["phase"] == "expand":
                    if c not in first_expand_start:
                        first_expand_start[c], m.t2 = r["seq"], r["t"]
                    if c in open_shrinks(open_calls, c):
                        out.append(
                            Violation(
                                "resize_order",
                                r["seq"],
                                f"cycle {c}: expand of {r['pipeline_id']} starts while a shrink is still running",
                            )
                        )
                elif c in first_expand_start:
                    out.append(
                        Violation(
                            "resize_order",
                            r["seq"],
                            f"cycle {c}: shrink of {r['pipeline_id']} starts after an expand started",
                        )
                    )
            else:
                if open_calls.pop(key, None) is None:
                    out.append(
                        Violation(
                            "resize_order",
                            r["seq"],
                            f"cycle {c}: resize_end without resize_start for {r['pipeline_id']} {r['phase']}",
                        )
                    )
                if r["phase"] == "shrink":
                    m.t1 = r["t"]
                    if c in first_expand_start:
                        out.append(
                            Violation(
                                "resize_order",
                                r["seq"],
                                f"cycle {c}: shrink of {r['pipeline_id']} returns after an expand started (T1 < T2 broken)",
                            )
                        )
        elif k == "signalled" and r["waiter"] == "request" and r.get("cycle") is not None and not r.get("error"):
            c = r["cycle"]
            m = marks.setdefault(c, CycleMarks())
            if m.t3 is None:
                m.t3 = r["t"]
            if any(key[0] == c and key[2] == "expand" for key in open_calls):
                out.append(
                    Violation(
                        "resize_order",
                        r["seq"],
                        f"cycle {c}: {r['cluster_id']} signalled before its expand returned (T2 < T3 broken)",
                    )
                )
        elif k == "commit":
            c = r["cycle"]
            still = [key for key in open_calls if key[0] == c]
            if still:
                out.append(
                    Violation(
                        "resize_order",
                        r["seq"],
                        f"cycle {c}: committed while resize calls are still running: {sorted(still)}",
                    )
                )
    return out, marks


@invariant("resize_order", reads=("resize_start", "resize_end", "signalled", "commit"))
def resize_order(records: Records) -> List[Violation]:
    """T1 < T2 < T3: every shrink of a cycle returns before any expand of it starts, and a
    waiter of that cycle is signalled only after all its expands returned."""
    return resize_walk(records)[0]


def open_shrinks(open_calls, cycle: int) -> Set[int]:
    return {cycle for key in open_calls if key[0] == cycle and key[2] == "shrink"}


@invariant("no_readd_in_cycle", reads=("plan",))
def no_readd_in_cycle(records: Records) -> List[Violation]:
    out: List[Violation] = []
    for r in records:
        if r["kind"] != "plan":
            continue
        removed = {(s["cluster_id"], b["dp_rank"]) for s in r["shrinks"] for b in s["bundles"]}
        for e in r["expands"]:
            for b in e["bundles"]:
                if (e["cluster_id"], b["dp_rank"]) in removed:
                    out.append(
                        Violation(
                            "no_readd_in_cycle",
                            r["seq"],
                            f"cycle {r['cycle']}: {e['cluster_id']} dp{b['dp_rank']} removed and re-added",
                        )
                    )
    return out


@invariant("activate_after_sync", reads=("effect_start", "effect_end"))
def activate_after_sync(records: Records) -> List[Violation]:
    """A rank becomes routable only after, since its last wake: a sync, a finalize after
    that sync, and a publish of the synced version."""
    out: List[Violation] = []
    # (pipeline, rank) -> [synced_version, finalized, seq of sync]
    rank: Dict[Tuple[str, int], dict] = {}
    published: Dict[str, int] = {}
    for r in records:
        if r["kind"] != "effect_end" and not (r["kind"] == "effect_start" and r["effect"] == "Activate"):
            continue
        pid, eff, args = r["pipeline_id"], r["effect"], r["args"]
        if r["kind"] == "effect_end" and r.get("error"):
            continue
        if eff == "Wake":
            for x in args["ranks"]:
                rank[(pid, x)] = {"version": None, "finalized": False}
        elif eff == "SyncFromCache":
            for x in args["ranks"]:
                st = rank.setdefault((pid, x), {"version": None, "finalized": False})
                st["version"], st["finalized"] = args["version"], False
        elif eff == "Finalize":
            for x in args["ranks"]:
                if (pid, x) in rank and rank[(pid, x)]["version"] is not None:
                    rank[(pid, x)]["finalized"] = True
        elif eff == "PublishVersion":
            published[pid] = args["version"]
        elif eff == "Activate" and r["kind"] == "effect_start":
            for x in args["ranks"]:
                st = rank.get((pid, x))
                if st is None or st["version"] is None:
                    out.append(
                        Violation(
                            "activate_after_sync", r["seq"], f"{pid} dp{x} activated without a sync since its wake"
                        )
                    )
                elif not st["finalized"]:
                    out.append(Violation("activate_after_sync", r["seq"], f"{pid} dp{x} activated before finalize"))
                elif published.get(pid) != st["version"]:
                    out.append(
                        Violation(
                            "activate_after_sync",
                            r["seq"],
                            f"{pid} dp{x} activated holding version {st['version']} while published is {published.get(pid)}",
                        )
                    )
    return out


def _is_train(args: dict) -> bool:
    return args.get("cluster") == "actor_train" or args.get("release_cluster") == "actor_train"


@invariant("release_after_publish", reads=("effect_start", "effect_end"))
def release_after_publish(records: Records) -> List[Violation]:
    """A pipeline that refreshes active ranks releases actor_train only after the refresh
    and the publish of the cache it just built.

    Parameter: under the header's ``scheduler.release_after_offload`` (RLix's MILES line,
    docs/rlix-variants.md) a release is also right once the step's training offload ended
    while an effect of that step is still open, i.e. one failed: MILES releases in a
    ``finally`` after the offload even when the sync fails."""
    head = records[0] if records and records[0]["kind"] == "header" else {}
    after_offload = bool((head.get("scheduler") or {}).get("release_after_offload"))
    # pipelines that refresh active ranks (a PublishVersion on path "active" anywhere in the
    # log, later ones too): a candidate finding is kept at the end if its pipeline is one
    # (one pass: the check runs online, harness/logs/invariants/online.py)
    active_path: Set[str] = set()
    candidates: List[Tuple[str, Violation]] = []
    built: Dict[str, int] = {}
    done: Dict[str, int] = {}
    offloaded: Dict[str, int] = {}  # pid -> step whose training offload ended
    open_step: Dict[str, Dict[str, int]] = {}  # pid -> step effect -> starts not ended
    for r in records:
        if r["kind"] not in ("effect_start", "effect_end"):
            continue
        pid, eff = r["pipeline_id"], r["effect"]
        if r["kind"] == "effect_start" and eff == "PublishVersion" and r["args"]["path"] == "active":
            active_path.add(pid)
        if after_offload and r.get("scope") == "step" and eff != "ReleaseGpus":
            opened = open_step.setdefault(pid, {})
            opened[eff] = opened.get(eff, 0) + (1 if r["kind"] == "effect_start" else -1)
            if r["kind"] == "effect_end" and eff == "OffloadTraining":
                offloaded[pid] = r.get("step")
        if r["kind"] == "effect_end" and eff == "BuildCache":
            built[pid] = r["args"]["version"]
        elif r["kind"] == "effect_end" and eff == "PublishVersion" and r["args"]["path"] == "active":
            done[pid] = r["args"]["version"]
        elif r["kind"] == "effect_start" and eff == "ReleaseGpus" and _is_train(r["args"]):
            if r["args"].get("global_step") is None:
                continue  # the init release: nothing was trained
            v = built.get(pid)
            if v is None or done.get(pid) == v:
                continue
            if (
                after_offload
                and offloaded.get(pid) == r.get("step")
                and any(n > 0 for n in open_step.get(pid, {}).values())
            ):
                continue  # MILES: released in a finally after the offload, a call of the step failed
            candidates.append(
                (
                    pid,
                    Violation(
                        "release_after_publish",
                        r["seq"],
                        f"{pid} releases actor_train before active refresh + publish of version {v}",
                    ),
                )
            )
    return [v for pid, v in candidates if pid in active_path]


@invariant("step_order", reads=("effect_start", "effect_end"))
def step_order(records: Records) -> List[Violation]:
    """No effect of step s+1 starts before every effect of step s has ended."""
    out: List[Violation] = []
    open_steps: Dict[str, Dict[int, int]] = {}
    # pipeline -> its steps with an effect open (count above 0): one or two, where
    # open_steps keeps every step of the run (scanned only when one of them is earlier)
    live_steps: Dict[str, Set[int]] = {}
    current: Dict[str, int] = {}
    for r in records:
        if r["kind"] not in ("effect_start", "effect_end") or r.get("scope") != "step" or r.get("step") is None:
            continue
        pid, step = r["pipeline_id"], r["step"]
        opened = open_steps.setdefault(pid, {})
        live = live_steps.setdefault(pid, set())
        if r["kind"] == "effect_start":
            # (in the order the steps were first opened, as open_steps keeps them)
            earlier = [s for s, n in opened.items() if s < step and n > 0] if any(s < step for s in live) else []
            if earlier:
                out.append(
                    Violation(
                        "step_order",
                        r["seq"],
                        f"{pid}: step {step} starts {r['effect']} while step {earlier[0]} is unfinished",
                    )
                )
            if step < current.get(pid, step):
                out.append(Violation("step_order", r["seq"], f"{pid}: step {step} after step {current[pid]}"))
            current[pid] = max(step, current.get(pid, step))
            n = opened[step] = opened.get(step, 0) + 1
        else:
            n = opened[step] = opened.get(step, 0) - 1
        if n > 0:
            live.add(step)
        else:
            live.discard(step)
    return out


class _AckWalk(DecisionWalk):
    """Each planned-release ack, judged against the holdings after its cycle's commit (or
    of its moment, for an ack returned at once)."""

    def __init__(self, records) -> None:
        super().__init__(records)
        self.out: List[Violation] = []
        self.acks: Dict[int, List[dict]] = {}

    def on_record(self, r: dict) -> None:
        if r["kind"] != "signalled" or r["waiter"] != "planned_release" or r["error"]:
            return
        if r["cycle"] is None:
            self.judge(r, "at once", None)
        else:
            self.acks.setdefault(r["cycle"], []).append(r)

    def after_commit(self, plan: dict, commit: dict) -> None:
        for r in self.acks.pop(commit["cycle"], []):
            self.judge(r, f"in cycle {commit['cycle']}", plan)

    def judge(self, r: dict, when: str, plan) -> None:
        cid = r["cluster_id"]
        held = self.h.held(cid)
        if not held:
            return
        ranks = sorted(self.h.ranks.get(cid, {}))
        what = ""
        if plan is not None:
            shrunk = sorted(b["dp_rank"] for s in plan["shrinks"] if s["cluster_id"] == cid for b in s["bundles"])
            grown = sorted(b["dp_rank"] for e in plan["expands"] if e["cluster_id"] == cid for b in e["bundles"])
            what = f"; the cycle shrank dp {shrunk or 'none'} and expanded dp {grown or 'none'}"
        self.out.append(
            Violation(
                "planned_release_ack",
                r["seq"],
                f"await_release of {cid} acked {when} while it still holds dp ranks {ranks} (GPUs {held}){what}",
            )
        )


planned_release_ack = invariant(
    "planned_release_ack", reads=("signalled", "plan", "commit", "released"), sees=DECISION_KINDS
)(
    walk_check(
        "planned_release_ack",
        _AckWalk,
        doc="""An ``await_release`` returns only when its GENERATION cluster is at zero.

    Read from the decisions alone: the cluster's holdings are rebuilt from plans applied
    at commit and from releases (:mod:`harness.logs.invariants.allocations`), and an ack of a
    cycle is judged against the holdings after that cycle's commit; an ack returned at
    once against the holdings of the moment. RLix acks every pending planned release at
    commit, so it acks one that arrived in the lock gap (never shrunk) and one whose
    cluster the gap-ratio planner re-expanded in the same cycle.""",
    )
)
