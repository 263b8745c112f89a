"""How the run ended: a fail-fast failure is a finding (``liveness``'s "the run terminates"
means it completes or reaches its horizon, not that it is shut down).

Reads the ``sim_end`` record (reason ``failed`` with its detail: a timeout, an OOM, a
crash, host-RAM exhaustion) and the gates' ``gate_abort`` / failed ``gate_end``. A run
cut by its horizon is an outcome of its own, judged by ``liveness``.
"""

from __future__ import annotations

from typing import List

from harness.logs.invariants.base import Records, Violation, invariant


@invariant("run_outcome", reads=("sim_end", "gate_end", "gate_abort"))
def run_outcome(records: Records) -> List[Violation]:
    out: List[Violation] = []
    for r in records:
        k = r["kind"]
        if k == "sim_end" and r["reason"] == "failed":
            out.append(Violation("run_outcome", r["seq"], f"the run failed: {r.get('detail') or 'no detail'}"))
        elif k == "gate_abort":
            out.append(Violation("run_outcome", r["seq"], f"gate rank {r['rank']} aborted: {r['reason']}"))
        elif k == "gate_end" and r["status"] == "failed":
            out.append(Violation("run_outcome", r["seq"], f"gate rank {r['rank']} ended failed (its report says why)"))
    return out
