"""RLix's timeouts: a wait that outlives its limit shuts the whole system down.

RLix bounds four of the waits the simulator models, and each expiry raises; any such
exception in the scheduler or a pipeline is a fail-fast shutdown of everything
(docs/modelled-systems.md#rlix-timeouts-and-measured-durations):

=================  =========================================  ======  ==============================
``what``           RLix setting                               limit   the wait
=================  =========================================  ======  ==============================
await_release      ``RLIX_NOTIFY_READY_TIMEOUT_S``            300 s   a planned shrink-to-zero (ROLL
                                                                      step start, end of a run)
resize_sync_lock   ``RLIX_RESIZE_LOCK_TIMEOUT_S``             180 s   the coordinator lock that
                                                                      serializes resizes and syncs
selective_sync     ``ROLL_SELECTIVE_MODEL_UPDATE_TIMEOUT_S``  150 s   one weight sync: group setup,
                                                                      buckets, teardown
shrink_drain       ``rebalance_on_shrink``                    30 s    aborted requests leaving the
                                                                      ranks being shrunk (Bug 7)
=================  =========================================  ======  ==============================

The limits are cost parameters (``CostSpec.*_timeout_s``), so a scenario can ask what a
slower link or a bigger model would do to a run RLix would otherwise kill. A deadline
is one :class:`~simulators.runtime.env.Timer` at start + limit that does nothing when the wait
is over by then; it runs for the ``("timeout", pipeline)`` actor, ordered after every
other kind, so a wait that ends at the very instant of its limit is in time.
"""

from __future__ import annotations

from typing import Callable

from simulators.runtime.env import Actor, Timer


class Deadlines:
    """The deadlines of one pipeline's waits."""

    def __init__(self, sim, pipeline_id: str, index: int) -> None:
        self.sim = sim
        self.pipeline_id = pipeline_id
        self.actor = Actor("timeout", index)

    def arm(self, what: str, limit_s: float, done: Callable[[], bool]) -> None:
        """Fail the run at now + ``limit_s`` unless ``done()`` holds by then."""
        sim = self.sim
        since = sim.env._now

        def expire(_arg) -> None:
            if done() or sim.failure:
                return
            sim.emit("timeout", pipeline_id=self.pipeline_id, what=what, limit_s=limit_s, since=since)
            sim.fail(f"{self.pipeline_id}: {what} timed out after {limit_s:g} s (waiting since t={since:.1f}s): "
                     "fail-fast shutdown")

        Timer(sim.env, limit_s, self.actor, expire, None)
