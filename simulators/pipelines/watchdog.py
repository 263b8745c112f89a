"""NeMo's generation watchdog in simulated time: the GENERATION re-request every ``watchdog_s``.

The decision is the control logic's (``harness.control.watchdog``); this mixin of
:class:`simulators.pipelines.pipeline.PipelineSim` only ticks it on a timer chain and carries
out what it asks, with the fault hooks that remove it (``no_gen_watchdog``) or make its request
under the resize lock (``watchdog_request_under_lock``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.control.reporting import request_input
from harness.control.watchdog import watchdog_alive, watchdog_tick
from harness.scheduler.types import GENERATION_CLUSTER
from simulators.faults.oracle import request_under_lock
from simulators.runtime.env import Actor, Timer
from simulators.runtime.simulation import SimFailure


class GenerationWatchdog:
    def _StartWatchdog(self, e):
        """NeMo's GENERATION re-request (``harness.control.watchdog``), every ``watchdog_s``.

        A :class:`~simulators.runtime.env.Timer` chain run for the ``("watchdog", index)`` actor: each
        tick is the one event a watchdog process's timeout would be, with the same key (so
        the same order), without resuming a process per tick. Under the fault
        ``no_gen_watchdog`` the chain ticks but sends nothing: it finds where the missing
        watchdog would have acted (:meth:`_watchdog_tick`)."""
        self._watchdog_actor = Actor("watchdog", self.index)
        self._watchdog_rearm()

    def _watchdog_rearm(self) -> None:
        if watchdog_alive(self.finished, self.sim.failure is not None):
            Timer(self.env, self.costs.watchdog_s, self._watchdog_actor, self._watchdog_tick, None)

    def _watchdog_locked(self, e):
        """The watchdog's re-request made while it holds the pipeline's resize lock (the
        fault ``watchdog_request_under_lock``, simulators/faults/oracle.py); it ticks again
        once its request returned."""
        try:
            yield from self.drive(request_under_lock(e), "watchdog", None)
        except SimFailure as exc:
            self.sim.fail(f"{self.pid} watchdog: {exc}")
            return
        self._watchdog_rearm()

    def _watchdog_tick(self, _arg: Any) -> None:
        sim, cid = self.sim, self._cid(GENERATION_CLUSTER)
        e = watchdog_tick(
            self.finished, sim.failure is not None, sim.model.state, cid, [r.life.state for r in self.ranks.values()]
        )
        if e is not None and "no_gen_watchdog" in self.faults:
            # the absent watchdog (fault no_gen_watchdog) is seen where it would have
            # re-requested GENERATION first: the record, and no tick after it
            self._fire("no_gen_watchdog")
            return
        if e is not None and self._request_under_lock_due():  # fault watchdog_request_under_lock
            self.env.spawn(self._watchdog_locked(e), "watchdog", self.index, 1)
            return  # the watchdog's thread is blocked in its request: no tick until it returns
        if e is not None:
            try:
                estimate = self._gen_estimate(GENERATION_CLUSTER, e.step_target_estimate)  # a field fault may drop it
                if estimate != e.step_target_estimate:
                    e = dataclasses.replace(e, step_target_estimate=estimate)
                sim.call("request", *request_input(sim.model, cid, e))
            except SimFailure as exc:
                sim.fail(f"{self.pid} watchdog: {exc}")
                return
        self._watchdog_rearm()
