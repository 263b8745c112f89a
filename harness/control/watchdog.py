"""NeMo's GENERATION re-request watchdog (debug #27/#32), as one decision both runtimes tick.

Every few seconds (2 s in NeMo; the runtime's clock decides when) the watchdog asks: is
the pipeline still running, registered, holding no rank that is awake or waking, and
without a pending GENERATION request? Then it re-requests GENERATION with
``step_target_estimate`` 1, so a pipeline whose ranks were all preempted is never left
without demand the scheduler can see. The request does not wait for its grant.
"""

from __future__ import annotations

from typing import Iterable, Optional

from harness.control.effects import RequestGpus
from harness.control.rank_state import RankState
from harness.scheduler.types import GENERATION_CLUSTER, Priority

REREQUEST = RequestGpus(GENERATION_CLUSTER, Priority.GENERATION, None, 1)


def watchdog_alive(finished: bool, stopped: bool) -> bool:
    """Whether the watchdog ticks again (it stops with its pipeline or the run)."""
    return not (finished or stopped)


def watchdog_tick(finished: bool, stopped: bool, registered: bool, rank_states: Iterable[RankState],
                  pending_request: bool) -> Optional[RequestGpus]:
    """The request to send now, or None. ``registered``: the scheduler knows the
    pipeline's GENERATION cluster; ``rank_states``: its inference ranks' states."""
    if finished or stopped or not registered:
        return None
    if any(state is not RankState.ASLEEP for state in rank_states) or pending_request:
        return None
    return REREQUEST
