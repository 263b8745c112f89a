"""Routing invariants (8): requests go only to routable ranks that hold weights, and no
request is lost or completed twice (an aborted request is dispatched again)."""

from __future__ import annotations

from typing import Dict, List, Set, Tuple

from harness.invariants.base import Records, Violation, invariant


@invariant("routing")
def routing(records: Records) -> List[Violation]:
    out: List[Violation] = []
    state: Dict[Tuple[str, int], str] = {}
    version: Dict[Tuple[str, int], object] = {}
    inflight: Dict[Tuple[str, int], int] = {}  # (pipeline, request) -> rank
    done: Set[Tuple[str, int]] = set()
    for r in records:
        k = r["kind"]
        if k == "rank_state":
            key = (r["pipeline_id"], r["dp_rank"])
            state[key] = r["state"]
            version[key] = r.get("version")
        elif k == "request_dispatch":
            key, req = (r["pipeline_id"], r["dp_rank"]), (r["pipeline_id"], r["request"])
            if state.get(key) != "routable":
                out.append(Violation("routing", r["seq"], f"request {req[1]} dispatched to {key[0]} dp{key[1]} in state {state.get(key, 'unknown')}"))
            if r.get("version") is None:
                out.append(Violation("routing", r["seq"], f"request {req[1]} dispatched to {key[0]} dp{key[1]}, which holds no weights"))
            if req in done:
                out.append(Violation("routing", r["seq"], f"request {req[1]} of {req[0]} dispatched after it completed"))
            if req in inflight:
                out.append(Violation("routing", r["seq"], f"request {req[1]} of {req[0]} dispatched twice"))
            inflight[req] = r["dp_rank"]
        elif k == "request_done":
            req = (r["pipeline_id"], r["request"])
            if req in done:
                out.append(Violation("routing", r["seq"], f"request {req[1]} of {req[0]} completed twice"))
            if inflight.pop(req, None) != r["dp_rank"]:
                out.append(Violation("routing", r["seq"], f"request {req[1]} of {req[0]} completed on dp{r['dp_rank']} where it was not running"))
            done.add(req)
        elif k == "request_abort":
            req = (r["pipeline_id"], r["request"])
            if inflight.pop(req, None) is None:
                out.append(Violation("routing", r["seq"], f"request {req[1]} of {req[0]} aborted while not running"))
    return out


@invariant("liveness")
def liveness(records: Records) -> List[Violation]:
    """Every pending request and planned release is eventually signalled (or errored), and a
    run that ended on its horizon names the waiters it left behind (invariant 17)."""
    out: List[Violation] = []
    waiting: Dict[int, Tuple[int, str]] = {}
    open_effects: Dict[Tuple[str, str, str], dict] = {}
    end = None
    for r in records:
        k = r["kind"]
        if k in ("effect_start", "effect_end"):
            key = (r["pipeline_id"], r["effect"], r.get("scope", ""))
            if k == "effect_start":
                open_effects[key] = r
            else:
                open_effects.pop(key, None)
        elif k == "enqueued":
            waiting[r["request_id"]] = (r["seq"], f"request of {r['cluster_id']} at {r['priority']}")
        elif k == "release_pending":
            waiting[r["request_id"]] = (r["seq"], f"await_release of {r['cluster_id']}")
        elif k == "signalled":
            waiting.pop(r["request_id"], None)
        elif k == "sim_end":
            end = r
    if end is not None and end["reason"] == "horizon":
        for rid, (seq, what) in sorted(waiting.items()):
            out.append(Violation("liveness", end["seq"], f"{what} (request {rid}, enqueued at seq {seq}) never returned before the horizon"))
        for (pid, effect, scope), start in sorted(open_effects.items()):
            step = f" of step {start['step']}" if start.get("step") is not None else ""
            out.append(Violation("liveness", end["seq"], f"{pid} stuck in {effect}{step} since t={start['t']:.1f}s"))
        if not waiting and not open_effects:
            out.append(Violation("liveness", end["seq"], "the run did not terminate before its horizon"))
    return out
