"""GPU conservation and single ownership, read from scheduler decisions (``gpu_ownership``).

Ownership is rebuilt from the decision records alone (:mod:`harness.logs.invariants.allocations`:
plan ops applied at their cycle's commit, and releases), so the check does not trust the
scheduler model that wrote them: a grant of a GPU someone else holds, or a free of a GPU
held by another cluster, is a violation wherever the log came from.
"""

from __future__ import annotations

from typing import List

from harness.logs.invariants.allocations import DECISION_KINDS, DecisionWalk
from harness.logs.invariants.base import Records, Violation, invariant


@invariant("gpu_ownership", reads=("plan", "commit", "released"), sees=DECISION_KINDS)
def gpu_ownership(records: Records) -> List[Violation]:
    out: List[Violation] = []

    def problem(seq: int, message: str) -> None:
        out.append(Violation("gpu_ownership", seq, message))

    class Walk(DecisionWalk):
        def after_commit(self, plan: dict, commit: dict) -> None:
            n = self.h.num_gpus
            if n is not None and commit["idle_gpus"] != n - len(self.h.owner):
                problem(
                    commit["seq"],
                    f"commit reports {commit['idle_gpus']} idle GPUs but the decisions leave {n - len(self.h.owner)}",
                )

    Walk(records, problem).run()
    return out
