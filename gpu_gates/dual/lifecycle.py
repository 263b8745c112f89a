"""Gate 4 driver, part three: the run-level effects of a pipeline's lifecycle
(``harness.control.lifecycle.pipeline_run``), each a real call. Mixed into
:class:`~gpu_gates.dual.driver.Driver`, whose state (model, books, locks) they use, as
``simulators/pipelines/pipeline.py`` handles the same effects in simulated time."""

from __future__ import annotations

import threading

from gpu_gates.dual.effects import INFER_GPUS, TRAIN_GPU
from harness.control.reporting import clear_progress_due
from harness.scheduler.types import ACTOR_TRAIN, GENERATION_CLUSTER


class LifecycleEffects:
    def _Register(self, pid, e):
        tps = {ACTOR_TRAIN: 1, GENERATION_CLUSTER: 1}
        maps = {ACTOR_TRAIN: [TRAIN_GPU[pid]], GENERATION_CLUSTER: list(INFER_GPUS)}
        self.call_model(
            "register",
            {"pipeline_id": pid, "cluster_tp_configs": tps, "cluster_device_mappings": maps},
            lambda: self.model.register(pid, tps, maps),
        )

    def _Admit(self, pid, e):
        self.call_model("admit", {"pipeline_id": pid}, lambda: self.model.admit(pid))

    def _StartWorkers(self, pid, e):
        """The pipeline's workers are this job's torchrun processes: already running."""

    def _StartWatchdog(self, pid, e):
        threading.Thread(target=self.watchdog, args=(pid,), name=f"watchdog {pid}", daemon=True).start()

    def _RunControl(self, pid, e):
        self.drive(pid, e.gen, e.scope, e.step, e.cycle)

    def _StepDone(self, pid, e):
        self.steps_done[pid] += 1

    def _MarkFinished(self, pid, e):
        self.finished[pid] = True

    def _ClearProgress(self, pid, e):
        if clear_progress_due(self.progress[pid]):
            self.call_model("clear_progress", {"pipeline_id": pid}, lambda: self.model.clear_progress(pid))

    def _GenerationHeld(self, pid, e):
        with self.lock:
            alloc = self.model.state.allocations.get(f"{pid}_{GENERATION_CLUSTER}")
            return alloc is not None and bool(alloc.active_dp_ranks)

    def _HoldCoordinator(self, pid, e):
        self.coord_lock[pid].acquire()

    def _Unregister(self, pid, e):
        self.call_model("unregister", {"pipeline_id": pid}, lambda: self.model.unregister(pid))
        self.gone[pid] = True

    def _Teardown(self, pid, e):
        """Its ranks leave routing (the worker processes stay up for the other pipeline's
        run and exit when the driver stops them all)."""
        self.routable[pid].clear()

    def _FreeCoordinator(self, pid, e):
        self.coord_lock[pid].release()

    def _CoordinatorAlive(self, pid, e):
        return not self.gone[pid]
