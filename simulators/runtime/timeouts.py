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
            sim.fail(
                f"{self.pipeline_id}: {what} timed out after {limit_s:g} s (waiting since t={since:.1f}s): "
                "fail-fast shutdown"
            )

        Timer(sim.env, limit_s, self.actor, expire, None)


def idle_bundle_bounds(scenario) -> dict:
    """Per pipeline, how long it may wait for its batch with no routable rank while a whole
    bundle of its inference mapping idles (the ``idle_bundle_starvation`` check's bound,
    written into the log header). ``costs.idle_bundle_bound_s`` when the scenario sets it;
    otherwise derived from the scenario's own timescales: twice what a healthy scheduler
    needs to hand the bundle over — two scheduler polls and a GENERATION watchdog period
    (the request is seen and planned), a donor's drain and sleep, and the expand itself
    (wake, a sync group, one bundle's weights loaded, finalize). Seconds on a 2-GPU default
    scenario (16 s), longer for a big model's refit; the former fixed 60 s let 11-21 s
    idles next to a waiting request pass."""
    c = scenario.costs
    out = {}
    for p in scenario.pipelines:
        if c.idle_bundle_bound_s > 0:
            out[p.name] = c.idle_bundle_bound_s
            continue
        pc = p.costs or c
        shard = p.model.weight_bytes / p.infer_tp
        handover = (
            2 * c.scheduler_poll_s
            + c.watchdog_s
            + pc.drain_s
            + pc.sleep_fixed_s
            + pc.sleep_s
            + pc.wake_fixed_s
            + pc.wake_s
            + pc.nccl_group_create_s
            + shard / pc.receiver_load_bytes_per_s
            + pc.finalize_s
        )
        out[p.name] = round(2 * handover, 3)
    return out
