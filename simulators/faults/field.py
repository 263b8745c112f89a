"""Fault hooks reproducing failures users reported (docs/modelled-systems.md#nemo-rl-failures-users-reported, #rlix-known-bugs-the-scenarios-reproduce).

Each hook is named in a scenario's ``faults:`` (documented in ``simulators/scenario/spec.py``
``FaultSpec``), fires at most where its ``at_step`` says, and leaves a ``fault_fired``
record; what follows is the simulated system's own behaviour, so the oracle or a modelled
failure (OOM, fail-fast) has to catch it from the log. Mixed into
:class:`simulators.pipelines.pipeline.PipelineSim`; each method is called from one hook point there,
in ``ranks.py``, ``refit.py``, ``pipeline_training.py`` or ``pipeline_rollouts.py``.
"""

from __future__ import annotations

from typing import List, Optional

from harness.scheduler.types import GENERATION_CLUSTER
from simulators.pipelines.inference import Request


class FieldFaults:
    def _fault_due(self, name: str, step: Optional[int] = None) -> bool:
        """Whether fault ``name`` is armed for this pipeline at ``step`` (default: the
        current step): from its ``at_step`` on."""
        at = self.faults.get(name)
        return at is not None and (self.ctx.step if step is None else step) >= at

    def _fire(self, name: str, step: Optional[int] = None) -> None:
        self.sim.emit("fault_fired", name=name, pipeline_id=self.pid, step=self.ctx.step if step is None else step)

    # NeMo RL #2899: the trajectory collector dies at the end of a dataset epoch
    def _collector_epoch_end(self, step: int) -> None:
        """Called when the batch of ``step`` opens: from ``at_step`` on the collector is dead
        and submits nothing more; the trainer's next ``WaitBatch`` waits forever."""
        if not self.collector.dead and self._fault_due("collector_dies", step):
            self.collector.dead = True
            self._fire("collector_dies", step)

    # NeMo RL #3238: one rollout straggles forever and wedges the step
    def _mark_straggler(self, reqs: List[Request], step: int) -> List[Request]:
        if reqs and not self._straggled and self._fault_due("stuck_request", step):
            self._straggled = True
            reqs[0].stuck = True  # every dispatch of it runs forever, re-dispatch included
            self._fire("stuck_request", step)
        return reqs

    # NeMo RL #3488: every engine crashes after a refit; the trainer polls an empty buffer
    def _maybe_crash_after_refit(self) -> None:
        """Called after an expand (wake → sync → publish → activate) completed. The engines
        die silently: in-flight requests vanish, nothing is routable, no one is told (the
        scheduler still counts the ranks as allocated; NeMo's watchdog sees ranks not asleep
        and asks for nothing)."""
        if self._crashed or not self._fault_due("engines_crash_after_refit"):
            return
        self._crashed = True
        self._fire("engines_crash_after_refit")
        self.router.crash()
        vram = self.sim.cluster.vram
        for rank in self.ranks.values():
            if rank.life.state.value != "asleep":
                rank.life.on("shutdown")
                self._log_rank(rank)
                for g in rank.gpus:
                    for owner, mem in [k for k in vram.entries[g] if k[0] == self._owner(rank)]:
                        vram.free(g, owner, mem)

    # NeMo RL #2775: offload_after_refit leaves the parameters on the GPU
    def _leave_params_on_gpu(self) -> None:
        """Called after the training offload: the parameters' share stays resident on every
        training GPU (once), so the next wake of an inference rank there runs out of memory."""
        if self._params_left or not self._fault_due("offload_keeps_params"):
            return
        self._params_left = True
        self._fire("offload_keeps_params")
        share = self.weight_bytes // len(self.train_gpus)
        for g in self.train_gpus:
            self.sim.cluster.vram.alloc(g, f"{self.pid}/train", "weights", share)

    # NeMo RL #3591: rebuilding the weight-sync group strands the old communicator
    def _strand_sync_group(self, group: str, gpus: List[int]) -> bool:
        """Called where a sync's dynamic NCCL group would be destroyed. Armed: it is not —
        the communicator stays alive with its buffers on every member GPU (charged here,
        when it is stranded), and the next sync builds a new one beside it. Returns whether
        the group was stranded."""
        if not self._fault_due("strand_sync_group"):
            return False
        self._fire("strand_sync_group")
        for g in gpus:
            self.sim.cluster.vram.alloc(g, f"{self.pid}/stranded:{group}", "nccl", self.costs.nccl_buffer_bytes)
        return True

    # RLix debug #27: a GENERATION request with neither estimate nor progress
    def _gen_estimate(self, cluster: str, estimate: Optional[int]) -> Optional[int]:
        if cluster == GENERATION_CLUSTER and estimate is not None and "no_gen_estimate" in self.faults:
            if not self._estimate_dropped:
                self._estimate_dropped = True
                self._fire("no_gen_estimate")
            return None
        return estimate

    # the active refresh's weight sync fails after the training offload (RLix MILES PR #13's case)
    def _maybe_fail_active_sync(self) -> None:
        if self._fault_due("active_sync_fails") and not self._active_sync_failed:
            self._active_sync_failed = True
            self._fire("active_sync_fails")
            from simulators.runtime.simulation import SimFailure  # runtime imports the pipeline's mixins

            raise SimFailure("active refresh sync failed at a receiver after the training offload")

    # an expand chain (wake → sync → publish → activate) that fails midway, no rollback
    def _maybe_fail_expand_sync(self) -> None:
        if self._fault_due("expand_sync_fails") and not self._expand_failed:
            self._expand_failed = True
            self._fire("expand_sync_fails")
            raise RuntimeError(
                "expand sync failed at a receiver; the woken ranks stay awake_unrouted "
                "(pre-activation) holding their memory, no rollback"
            )
