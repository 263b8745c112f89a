"""Routing invariants (8): requests go only to routable ranks that hold weights, and no
request is lost or completed twice (an aborted request is dispatched again)."""

from __future__ import annotations

from typing import Dict, List, Set, Tuple

from harness.invariants.base import Records, Violation, invariant


@invariant("routing", reads=("rank_state", "request_dispatch", "request_done", "request_abort"))
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


#: How long a waiter must have waited, with its pipeline showing no progress, for a run
#: cut by its horizon to count it as stalled: RLix's longest fail-fast deadline
#: (``RLIX_NOTIFY_READY_TIMEOUT_S``, 300 s). Anything shorter is a run that was still going.
STALL_WINDOW_S = 300.0

# records that show a pipeline is still moving: work finished, a batch taken
_PROGRESS_KINDS = ("request_done", "batch_consumed", "effect_end")


@invariant("liveness", reads=("effect_start", "effect_end", "enqueued", "release_pending", "signalled", "sim_end",
                               "register", "request_done", "batch_consumed"))
def liveness(records: Records) -> List[Violation]:
    """Every pending request and planned release is eventually signalled (or errored) (invariant 17).

    Reaching the horizon is an outcome of its own, not a finding: a run cut while it was
    progressing passes. A waiter left at the horizon is a stall only when it has waited at
    least :data:`STALL_WINDOW_S` and its pipeline logged no progress (a request done, a batch
    consumed, an effect ended) during that last window: then nothing was going to release it."""
    out: List[Violation] = []
    waiting: Dict[int, Tuple[int, float, str, str]] = {}  # request id -> (seq, t, cluster, what)
    open_effects: Dict[Tuple[str, str, str], dict] = {}
    last_progress: Dict[str, float] = {}
    pipelines: List[str] = []
    end = None
    for r in records:
        k = r["kind"]
        if k in _PROGRESS_KINDS and "pipeline_id" in r:
            last_progress[r["pipeline_id"]] = r["t"]
        if k in ("effect_start", "effect_end"):
            key = (r["pipeline_id"], r["effect"], r.get("scope", ""))
            if k == "effect_start":
                open_effects[key] = r
            else:
                open_effects.pop(key, None)
        elif k == "register":
            pipelines.append(r["pipeline_id"])
        elif k == "enqueued":
            waiting[r["request_id"]] = (r["seq"], r["t"], r["cluster_id"], f"request of {r['cluster_id']} at {r['priority']}")
        elif k == "release_pending":
            waiting[r["request_id"]] = (r["seq"], r["t"], r["cluster_id"], f"await_release of {r['cluster_id']}")
        elif k == "signalled":
            waiting.pop(r["request_id"], None)
        elif k == "sim_end":
            end = r
    if end is None or end["reason"] != "horizon":
        return out
    cutoff = end["t"] - STALL_WINDOW_S

    def stalled(pid: str, since: float) -> bool:
        return since <= cutoff and last_progress.get(pid, float("-inf")) <= cutoff

    def owner(cluster_id: str) -> str:
        # cluster ids are "<pipeline>_<cluster>"; a log without its register records falls
        # back on the cluster names every pipeline has (actor_train, actor_infer)
        return next((p for p in pipelines if cluster_id.startswith(p + "_")), cluster_id.rsplit("_actor_", 1)[0])

    for rid, (seq, t, cid, what) in sorted(waiting.items()):
        if stalled(owner(cid), t):
            out.append(Violation("liveness", end["seq"], f"{what} (request {rid}, enqueued at seq {seq}, t={t:.1f}s) "
                                 f"never returned; its pipeline made no progress in the last {STALL_WINDOW_S:g} s"))
    for (pid, effect, scope), start in sorted(open_effects.items()):
        if stalled(pid, start["t"]):
            step = f" of step {start['step']}" if start.get("step") is not None else ""
            out.append(Violation("liveness", end["seq"], f"{pid} stuck in {effect}{step} since t={start['t']:.1f}s "
                                 f"with no progress in the last {STALL_WINDOW_S:g} s"))
    return out
