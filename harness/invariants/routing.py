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
