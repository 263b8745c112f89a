"""GPU conservation and single ownership, read from scheduler decisions (``gpu_ownership``).

Ownership is rebuilt from the decision records alone (:mod:`harness.logs.invariants.allocations`:
plan ops applied at their cycle's commit, and releases), so the check does not trust the
scheduler model that wrote them: a grant of a GPU someone else holds, or a free of a GPU
held by another cluster, is a violation wherever the log came from.
"""

from __future__ import annotations

from typing import List

from harness.logs.invariants.allocations import DECISION_KINDS, DecisionWalk
from harness.logs.invariants.base import Violation, invariant
from harness.logs.invariants.decision_walks import walk_check


class _OwnershipWalk(DecisionWalk):
    """The holdings' own inconsistencies, and each commit's idle count against them."""

    def __init__(self, records) -> None:
        self.out: List[Violation] = []
        super().__init__(records, self._problem)

    def _problem(self, seq: int, message: str) -> None:
        self.out.append(Violation("gpu_ownership", seq, message))

    def after_commit(self, plan: dict, commit: dict) -> None:
        n = self.h.num_gpus
        if n is not None and commit["idle_gpus"] != n - len(self.h.owner):
            self._problem(
                commit["seq"],
                f"commit reports {commit['idle_gpus']} idle GPUs but the decisions leave {n - len(self.h.owner)}",
            )


gpu_ownership = invariant("gpu_ownership", reads=("plan", "commit", "released"), sees=DECISION_KINDS)(
    walk_check("gpu_ownership", _OwnershipWalk)
)
