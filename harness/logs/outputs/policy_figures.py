"""The figures that compare scheduling policies, read from the log alone (docs/policies.md).

* **policy**: the header's ``scheduler.policy`` (absent: ``gap_ratio``, RLix's planner).
* **useful GPU-seconds**: GPU-seconds of training work (every training-category effect on
  its GPUs, the per-GPU split of the summary) plus, for inference, GPU-seconds of a routable
  DP rank while at least one request is in flight on it (``request_dispatch`` until that
  request's ``request_done`` / ``request_abort`` / ``request_failed``), times the rank's
  GPUs. A rank that never logs a request (a single controller's streaming engine) counts
  its whole routable time. Everything else -- idle GPUs, awake ranks with nothing to
  serve, waking, weight syncs, resizing -- is not useful. **Cost efficiency** is useful
  GPU-seconds over all GPU-seconds (GPUs x run length).
* **preemptions**: GENERATION DP ranks a plan shrinks while at least one request is in
  flight on them, whose GPUs the same plan hands to another pipeline (a non-GENERATION
  grant or another pipeline's expand): work was cut off for someone else. A rank its own
  pipeline's training takes (partial overlap), a rank with nothing in flight (a phase that
  was over, a planned release) is not one.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List, Mapping, Sequence, Set, Tuple

from harness.ordered_sum import ordered_sum

#: the kinds :func:`policy_figures` reads
POLICY_KINDS = ("rank_state", "request_dispatch", "request_done", "request_abort", "request_failed", "plan")
_END = ("request_done", "request_abort", "request_failed")


def policy_name(records: Sequence[Mapping[str, Any]]) -> str:
    head = records[0] if records and records[0].get("kind") == "header" else {}
    return str((head.get("scheduler") or {}).get("policy", "gap_ratio"))


def _pipeline(cluster_id: str) -> str:
    return cluster_id.rsplit("_actor_", 1)[0]


def _scan(records: Sequence[Mapping[str, Any]], t_end: float) -> Tuple[float, int]:
    """(GPU-seconds of routable ranks with a request in flight, preemptions): see the
    module docstring."""
    routable: Dict[Tuple[str, int], Tuple[float, int]] = {}  # rank -> (since, GPUs)
    flight: Dict[Tuple[str, int], int] = defaultdict(int)
    busy_since: Dict[Tuple[str, int], float] = {}
    where: Dict[Tuple[str, Any], Tuple[str, int]] = {}  # (pipeline, request) -> rank
    logs_requests: Set[str] = set()
    spans: List[float] = []
    whole: Dict[Tuple[str, int], List[float]] = defaultdict(list)
    preempted = 0

    def close(key: Tuple[str, int], t: float) -> None:
        since = busy_since.pop(key, None)
        if since is not None and key in routable and t > since:
            spans.append((t - since) * routable[key][1])

    for r in records:
        k = r["kind"]
        if k == "plan":
            if r.get("shrinks"):
                preempted += _preempted(r, flight)
        elif k == "rank_state":
            key, t = (r["pipeline_id"], r["dp_rank"]), float(r["t"])
            if key in routable:
                close(key, t)
                since, n = routable.pop(key)
                whole[key].append((t - since) * n)
            if r.get("state") == "routable":
                routable[key] = (t, len(r.get("gpus") or ()) or 1)
                if flight[key] > 0:
                    busy_since[key] = t
        elif k == "request_dispatch":
            key = (r["pipeline_id"], r["dp_rank"])
            logs_requests.add(r["pipeline_id"])
            where[(r["pipeline_id"], r["request"])] = key
            flight[key] += 1
            if flight[key] == 1 and key in routable:
                busy_since[key] = float(r["t"])
        elif k in _END:
            key = where.pop((r["pipeline_id"], r["request"]), None)
            if key is not None and flight[key] > 0:
                flight[key] -= 1
                if flight[key] == 0:
                    close(key, float(r["t"]))
    for key in list(routable):
        close(key, t_end)
        since, n = routable.pop(key)
        whole[key].append((t_end - since) * n)
    return ordered_sum(spans) + ordered_sum(
        x for key, xs in sorted(whole.items()) if key[0] not in logs_requests for x in xs
    ), preempted


def _preempted(r: Mapping[str, Any], flight: Mapping[Tuple[str, int], int]) -> int:
    """Shrunk ranks of one plan with requests in flight whose GPUs go to another pipeline."""
    count = 0
    taken: Dict[int, str] = {}
    for s in r.get("signals") or ():
        if s.get("priority") != "GENERATION":
            for g in s.get("gpus") or ():
                taken[g] = _pipeline(s["cluster_id"])
    for e in r.get("expands") or ():
        for b in e.get("bundles") or ():
            for g in b["gpus"]:
                taken[g] = _pipeline(e["cluster_id"])
    for s in r["shrinks"]:
        mine = _pipeline(s["cluster_id"])
        count += sum(
            1
            for b in s.get("bundles") or ()
            if flight.get((mine, b["dp_rank"]), 0) > 0 and any(taken.get(g, mine) != mine for g in b["gpus"])
        )
    return count


def policy_figures(records: Sequence[Mapping[str, Any]], summary_json: Mapping[str, Any]) -> Dict[str, Any]:
    """``records``: the log (header first); ``summary_json``: its summary.json mapping."""
    run = summary_json["run"]
    t_end, span = float(run["end_s"]), float(run["simulated_s"])
    gpus = summary_json.get("gpus") or []
    total = span * len(gpus)
    train = ordered_sum(g["train_s"] for g in gpus)
    kinds = set(POLICY_KINDS)
    serving, preemptions = _scan([r for r in records if r["kind"] in kinds], t_end)
    useful = train + serving
    waste = summary_json.get("waste") or {}
    return {
        "policy": policy_name(records),
        "useful_gpu_s": useful,
        "gpu_s": total,
        "cost_efficiency_pct": (100.0 * useful / total) if total > 0 else 0.0,
        "preemptions": preemptions,
        "expands": waste.get("expands", 0),
        "wasted_expands": waste.get("wasted_expands", 0),
        "resize_s": ordered_sum(p["expand_s"] + p["shrink_s"] for p in waste.get("pipelines") or ()),
    }
