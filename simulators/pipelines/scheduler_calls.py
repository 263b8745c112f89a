"""A simulated pipeline's calls into the scheduler model: request, release, release-then-request
and await-release, each waiting on its ticket as RLix's blocking RPCs do.

Mixed into :class:`simulators.pipelines.pipeline.PipelineSim`; the calls go through
:meth:`simulators.runtime.simulation.Simulation.call`, which logs them and delivers the
scheduler's answer after the modelled RPC delay.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from harness.control.reporting import request_input
from harness.scheduler.types import ACTOR_TRAIN, Priority
from simulators.runtime.simulation import SimFailure

_TRAIN_PHASE_OF = {
    Priority.INITIALIZATION: "init",
    Priority.OLD_LOG_PROBS: "old_log_probs",
    Priority.ACTOR_TRAINING: "train",
}


class SchedulerCalls:
    def _cid(self, cluster: str) -> str:
        return f"{self.pid}_{cluster}"

    def _wait_ticket(self, ticket, timeout: Optional[Tuple[str, float]] = None):
        """Wait for a scheduler ticket; ``timeout`` = (what, limit) arms an RLix deadline."""
        if ticket.done:
            return ticket.gpus
        waiter = self.sim.waiter(ticket.request_id)
        if timeout is not None:
            self.deadlines.arm(*timeout, lambda: waiter.triggered)
        signal = yield waiter
        if signal.error:
            raise SimFailure(f"request {ticket.request_id} failed: {signal.error}")
        return signal.gpus

    def _RequestGpus(self, e):
        cid, sim = self._cid(e.cluster), self.sim
        if e.cluster == ACTOR_TRAIN:
            self.train_phase = _TRAIN_PHASE_OF.get(e.priority, self.train_phase)
        estimate = self._gen_estimate(e.cluster, e.step_target_estimate)  # a field fault may drop it
        if estimate != e.step_target_estimate:
            e = dataclasses.replace(e, step_target_estimate=estimate)
        ticket = sim.call("request", *request_input(sim.model, cid, e))
        gpus = yield from self._wait_ticket(ticket)
        return gpus

    def _ReleaseGpus(self, e):
        sim, cid = self.sim, self._cid(e.cluster)
        fields = {"cluster_id": cid}
        if e.global_step is not None:
            fields["global_step"] = e.global_step
        sim.call("release", fields, lambda: sim.model.release(cid, global_step=e.global_step))
        return None

    def _ReleaseThenRequest(self, e):
        sim = self.sim
        if e.request_cluster == ACTOR_TRAIN:
            self.train_phase = _TRAIN_PHASE_OF.get(e.priority, self.train_phase)
        rel, req = self._cid(e.release_cluster), self._cid(e.request_cluster)
        fields = {"release_cluster_id": rel, "request_cluster_id": req, "request_priority": e.priority.name}
        if e.global_step is not None:
            fields.update(release_global_step=e.global_step, request_global_step=e.global_step)
        ticket = sim.call(
            "release_then_request",
            fields,
            lambda: sim.model.release_then_request(
                rel, req, e.priority, release_global_step=e.global_step, request_global_step=e.global_step
            ),
        )
        gpus = yield from self._wait_ticket(ticket)
        return gpus

    def _AwaitRelease(self, e):
        sim = self.sim
        fields = {"pipeline_id": self.pid}
        if e.global_step is not None:
            fields["global_step"] = e.global_step
        ticket = sim.call(
            "await_release", fields, lambda: sim.model.await_release(pipeline_id=self.pid, global_step=e.global_step)
        )
        yield from self._wait_ticket(ticket, ("await_release", self.costs.await_release_timeout_s))
        return None
