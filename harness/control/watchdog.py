"""NeMo's GENERATION re-request watchdog (debug #27/#32), as one decision both runtimes tick.

Every few seconds (2 s in NeMo; the runtime's clock decides when) the watchdog asks: is
the pipeline still running, has its GENERATION cluster been granted before (the
scheduler keeps its allocation, possibly shrunk to no rank at all), is none of its ranks
awake or waking, and is no GENERATION request pending? Then it re-requests GENERATION with
``step_target_estimate`` 1, so a pipeline whose ranks were all preempted is never left
without demand the scheduler can see. The request does not wait for its grant.
"""

from __future__ import annotations

from typing import Iterable, Optional

from harness.control.effects import RequestGpus
from harness.control.rank_state import RankState
from harness.scheduler.state import SchedulerState
from harness.scheduler.types import GENERATION_CLUSTER, Priority

REREQUEST = RequestGpus(GENERATION_CLUSTER, Priority.GENERATION, None, 1)


def watchdog_alive(finished: bool, stopped: bool) -> bool:
    """Whether the watchdog ticks again (it stops with its pipeline or the run)."""
    return not (finished or stopped)


def watchdog_tick(
    finished: bool, stopped: bool, state: SchedulerState, cluster_id: str, rank_states: Iterable[RankState]
) -> Optional[RequestGpus]:
    """The request to send now, or None. ``state``: the scheduler model's state (read
    only); ``cluster_id``: the pipeline's GENERATION cluster; ``rank_states``: its
    inference ranks' states."""
    if finished or stopped or cluster_id not in state.allocations:  # never granted, or gone
        return None
    if any(s is not RankState.ASLEEP for s in rank_states) or state.pending_for(cluster_id) is not None:
        return None
    return REREQUEST
