"""RLix's background rebalance trigger: the 1 s poll that starts a scheduling cycle with no
input behind it (docs/modelled-systems.md#rlix-scheduling-loop-and-background-rebalance).

A pure function of the scheduler's state and options; :meth:`SchedulerModel.background_rebalance_reason`
(harness/scheduler/model.py) is its entry point, which also answers None once the model failed.
"""

from __future__ import annotations

import math
from typing import Optional

from harness.ordered_sum import ordered_sum
from harness.scheduler.options import SchedulerOptions
from harness.scheduler.state import SchedulerState
from harness.scheduler.types import GENERATION_CLUSTER, Priority, parse_cluster_id

_GENERATION = Priority.GENERATION  # the enum attribute lookup is slow enough to show up per poll


def background_rebalance_reason(state: SchedulerState, options: SchedulerOptions) -> Optional[str]:
    """ "2.2" (a suspended GEN cluster with demand), "2.1" (the worst half's share of the
    demand deviates from its share of the GPUs by more than the threshold), or None."""
    if state.has_waiters():
        return None
    rows = []
    for cid, alloc in state.allocations.items():
        if alloc.priority != _GENERATION:
            continue
        pid, name = parse_cluster_id(cid)
        if name != GENERATION_CLUSTER or pid not in state.registry:
            continue
        tp = state.registry[pid].infer.tp_size
        remaining, required = state.progress.totals(pid)
        if not alloc.active_dp_ranks and remaining > 0.0:
            return "2.2"
        completion = 0.0 if required <= 0.0 else max(0.0, 1.0 - remaining / required)
        rows.append((completion, remaining * tp, len(alloc.active_dp_ranks) * tp))
    if len(rows) < 2:
        return None
    total_w = ordered_sum(r[1] for r in rows)
    total_g = sum(r[2] for r in rows)
    if total_w <= 0.0 or total_g <= 0:
        return None
    rows.sort(key=lambda r: r[0])
    worst = rows[: max(1, math.ceil(len(rows) * options.rebalance_worst_fraction))]
    deviation = abs(ordered_sum(r[1] for r in worst) / total_w - sum(r[2] for r in worst) / float(total_g)) * 100.0
    return "2.1" if deviation > options.rebalance_threshold_pp else None
