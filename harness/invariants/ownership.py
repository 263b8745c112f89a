"""GPU conservation and single ownership, read from scheduler decisions (invariant 1).

Ownership is rebuilt from the decision records alone — plan ops applied at their cycle's
commit, and releases — so the check does not trust the scheduler model that wrote them:
a grant of a GPU someone else holds, or a free of a GPU held by another cluster, is a
violation wherever the log came from.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from harness.invariants.base import Records, Violation, invariant


@invariant("gpu_ownership")
def gpu_ownership(records: Records) -> List[Violation]:
    out: List[Violation] = []
    header = records[0] if records and records[0]["kind"] == "header" else None
    num_gpus: Optional[int] = None
    if header is not None:
        c = header["cluster"]
        num_gpus = c["nodes"] * c["gpus_per_node"]
    owner: Dict[int, str] = {}
    plans: Dict[int, dict] = {}

    def free(seq: int, cluster: str, gpus) -> None:
        for g in gpus:
            held = owner.get(g)
            if held == cluster:
                del owner[g]
            elif held is not None:
                out.append(Violation("gpu_ownership", seq, f"{cluster} frees GPU {g} held by {held}"))

    def grant(seq: int, cluster: str, gpus) -> None:
        for g in gpus:
            if num_gpus is not None and not 0 <= g < num_gpus:
                out.append(Violation("gpu_ownership", seq, f"{cluster} granted GPU {g} outside the cluster (0..{num_gpus - 1})"))
            held = owner.get(g)
            if held is not None and held != cluster:
                out.append(Violation("gpu_ownership", seq, f"GPU {g} granted to {cluster} while held by {held}"))
            owner[g] = cluster

    for r in records:
        k = r["kind"]
        if k == "plan":
            plans[r["cycle"]] = r
        elif k == "commit":
            plan = plans.pop(r["cycle"], None)
            if plan is None:
                out.append(Violation("gpu_ownership", r["seq"], f"commit of cycle {r['cycle']} without a plan"))
                continue
            skipped = set(r.get("skipped_stale", []))
            for s in plan["shrinks"]:
                for b in s["bundles"]:
                    free(r["seq"], s["cluster_id"], b["gpus"])
            for s in plan["signals"]:
                if s["gpus"] and f"grant {s['cluster_id']}" not in skipped:
                    # a grant replaces the cluster's allocation: whatever it held is freed
                    for g in [g for g, c in owner.items() if c == s["cluster_id"]]:
                        del owner[g]
                    grant(r["seq"], s["cluster_id"], s["gpus"])
            for e in plan["expands"]:
                if f"expand {e['cluster_id']}" not in skipped:
                    for b in e["bundles"]:
                        grant(r["seq"], e["cluster_id"], b["gpus"])
            if num_gpus is not None and r["idle_gpus"] != num_gpus - len(owner):
                out.append(Violation("gpu_ownership", r["seq"],
                                     f"commit reports {r['idle_gpus']} idle GPUs but the decisions leave {num_gpus - len(owner)}"))
        elif k == "released":
            free(r["seq"], r["cluster_id"], r["gpus"])
    return out
