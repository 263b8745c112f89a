"""A GENERATION cluster given back through ``await_release`` stays given back until its
pipeline asks again (invariant ``reactivated_after_release``).

Why: a ROLL-style pipeline calls ``await_release`` when its rollout is done and then
trains on GPUs its inference ranks shared; a NeMo pipeline calls it on its way to
``unregister``. Either way the pipeline has said it needs no inference ranks until its next
GENERATION request. RLix keeps the cluster's (now empty) allocation entry after the
planned shrink, and RLix's main planner skips a cluster with no progress and no pending
request, so nothing re-expands it. The MILES line's demand floor (rlops/rlix d455b0c) gives
exactly such a cluster a demand of 1.0 because its allocation entry is still there: the
planner then re-expands a pipeline that is training, whose woken ranks sync from a cache
that training is about to replace (docs/rlix-variants.md).

Read from the log's decisions alone (a replay's output carries no inputs): the ack is the
``signalled`` record of waiter ``planned_release``; the pipeline asks again when a request
for that cluster is ``enqueued`` (or served at once: a ``signalled`` request with no cycle);
the allocation entry goes with a ``released`` record (a release, or the unregister); an
expand is a
``plan`` record's expand of that cluster, counted unless its cycle's ``commit`` skipped it
as stale (an expand whose cycle never commits, the run having ended meanwhile, ran: it counts).
"""

from __future__ import annotations

from typing import Dict, List

from harness.logs.invariants.allocations import is_gen_cluster, pipeline_of
from harness.logs.invariants.base import Records, Violation, invariant


@invariant("reactivated_after_release", reads=("signalled", "plan", "commit", "enqueued", "released", "unregister"))
def reactivated_after_release(records: Records) -> List[Violation]:
    """No committed expand of a GENERATION cluster between its ``await_release`` ack and
    its pipeline's next request for it (or its unregister)."""
    out: List[Violation] = []
    released: Dict[str, dict] = {}  # cluster -> the ack that gave it back
    planned: Dict[int, List[tuple]] = {}  # cycle -> [(cluster, dp ranks, plan seq, ack)]
    for r in records:
        k = r["kind"]
        if k == "signalled":
            if r["waiter"] == "planned_release" and not r.get("error") and is_gen_cluster(r["cluster_id"]):
                released[r["cluster_id"]] = r
            elif r["waiter"] == "request" and r.get("cycle") is None:
                released.pop(r["cluster_id"], None)  # a request served at once
        elif k in ("enqueued", "released"):
            released.pop(r["cluster_id"], None)  # asked again, or the entry is gone
        elif k == "unregister":
            pid = r["pipeline_id"]
            for cid in [c for c in released if pipeline_of(c) == pid]:
                del released[cid]
        elif k == "plan":
            for e in r["expands"]:
                ack = released.get(e["cluster_id"])
                if ack is not None:
                    ranks = sorted(b["dp_rank"] for b in e["bundles"])
                    planned.setdefault(r["cycle"], []).append((e["cluster_id"], ranks, r["seq"], ack))
        elif k == "commit":
            skipped = set(r.get("skipped_stale", []))
            for item in planned.pop(r["cycle"], []):
                if f"expand {item[0]}" not in skipped:
                    out.append(_violation(r["cycle"], *item))
    for cycle in sorted(planned):  # planned and never committed (the run ended meanwhile): it ran
        out.extend(_violation(cycle, *item) for item in planned[cycle])
    return out


def _violation(cycle: int, cid: str, ranks: List[int], seq: int, ack: dict) -> Violation:
    when = f"cycle {ack['cycle']}" if ack.get("cycle") is not None else "at once"
    return Violation(
        "reactivated_after_release",
        seq,
        f"cycle {cycle} expands {cid} dp {ranks}, which await_release gave back "
        f"(ack seq {ack['seq']}, {when}) with no request for it since and no unregister",
    )
