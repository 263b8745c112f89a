"""The scheduler model's decision records: what a plan and a signal look like in the
event log (the replay, the oracle and the outputs read them).

A record's key order is the event log's ("kind" first), so the model appends each as it is
built; :func:`jsonable` makes a plan-validation failure's context writable.
"""

from __future__ import annotations

from typing import Any, Dict, List

from harness.scheduler.commit import Signal
from harness.scheduler.cycle import CyclePlan
from harness.scheduler.state import SchedulerState
from harness.scheduler.types import parse_cluster_id


def _shrunk_bundle(state: SchedulerState, cluster_id: str, rank: int) -> List[int]:
    alloc = state.allocations.get(cluster_id)
    if alloc is not None and rank in alloc.dp_rank_to_gpus:
        return list(alloc.dp_rank_to_gpus[rank])
    return state.registry[parse_cluster_id(cluster_id)[0]].infer.bundle(rank)


def plan_record(cp: CyclePlan, state: SchedulerState) -> Dict[str, Any]:
    """The decision record of a plan, with every dp rank's GPU bundle spelled out.

    Its key order is the event log's ("kind" first), so the model appends it as is.
    """
    plan = cp.plan
    return {
        "kind": "plan",
        "cycle": cp.cycle,
        "shrinks": [
            {
                "cluster_id": op.cluster_id,
                "bundles": [
                    {"dp_rank": r, "gpus": _shrunk_bundle(state, op.cluster_id, r)} for r in op.dp_ranks_to_remove
                ],
            }
            for op in plan.shrinks
        ],
        "signals": [
            {"cluster_id": op.cluster_id, "priority": op.priority.name, "gpus": list(op.gpus)} for op in plan.signals
        ],
        "expands": [
            {
                "cluster_id": op.cluster_id,
                "has_pending_request": op.has_pending_request,
                "bundles": [{"dp_rank": r, "gpus": list(g)} for r, g in op.dp_rank_to_gpus.items()],
            }
            for op in plan.expands
        ],
    }


def signal_record(s: Signal) -> Dict[str, Any]:
    rec: Dict[str, Any] = {
        "kind": "signalled",
        "request_id": s.request_id,
        "waiter": s.kind,
        "cluster_id": s.cluster_id,
        "priority": s.priority.name if s.priority is not None else None,
        "gpus": list(s.gpus),
        "cycle": s.cycle,
        "error": s.error,
    }
    # Signal.shrink_executed stays in the model (its own tests read it) and out of the
    # log: no check may read what the system under test says about its own correctness.
    return rec


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        items = sorted(value) if isinstance(value, set) else value
        return [jsonable(v) for v in items]
    return value
