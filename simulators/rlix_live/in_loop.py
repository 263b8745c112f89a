"""``scheduler: {implementation: rlix, source: PATH}``: the simulator's scheduler decisions
come from RLix's own ``SchedulerImpl`` (docs/rlix-live.md).

:class:`LiveRlixModel` is the scheduler model's interface with RLix deciding: every input
the simulator sends goes to both (the model keeps its bookkeeping: request tickets, the
decision records the event log and the oracle read), and each cycle's plan is RLix's,
translated into the model's plan and committed by both. So every runtime, check and
output works unchanged on RLix's decisions. An input RLix refuses where the model took it,
or a cycle RLix fails, fails the scheduler fast (a finding, as RLix would shut down).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from harness.scheduler.cycle import CyclePlan, _resize_calls
from harness.scheduler.model import SchedulerModel
from harness.scheduler.records import plan_record
from harness.scheduler.options import SchedulerOptions
from harness.scheduler.progress import ProgressReport
from harness.scheduler.types import ExecutionPlan, ExpandOp, PlanValidationError, Priority, ShrinkOp, SignalOp
from harness.scheduler.validation import validate_plan
from harness.scheduler.topology import ClusterTopology
from simulators.rlix_live.driver import LiveRejected, LiveScheduler
from simulators.rlix_live.loader import RlixModules


def model_plan(plan: Any) -> ExecutionPlan:
    """RLix's ExecutionPlan as the model's (same operations, the model's types)."""
    return ExecutionPlan(
        shrinks=[ShrinkOp(op.cluster_id, list(op.dp_ranks_to_remove)) for op in plan.sched_guided_shrink_ops],
        signals=[
            SignalOp(
                op.cluster_id, list(op.gpus_to_allocate), Priority[op.priority.name], op.lora_name, int(op.tp_size)
            )
            for op in plan.signal_pending_allocation_ops
        ],
        expands=[
            ExpandOp(
                op.cluster_id,
                {int(r): list(g) for r, g in op.dp_rank_to_gpus_to_add.items()},
                bool(op.has_pending_request),
                int(op.tp_size),
            )
            for op in plan.sched_guided_allocation_ops
        ],
        clusters_to_remove=set(plan.clusters_to_remove),
    )


class LiveRlixModel(SchedulerModel):
    def __init__(self, topology: ClusterTopology, options: SchedulerOptions, mods: RlixModules) -> None:
        super().__init__(topology, options)
        self.mods = mods
        self.live = LiveScheduler(mods, topology.num_gpus, topology.gpus_per_node)
        self._depth = 0  # the model's composite inputs call its primitive ones: RLix gets the outer call only

    def close(self) -> None:
        self.live.close()

    def _both(self, kind: str, fields: Dict[str, Any], model_call) -> Any:
        self._depth += 1
        try:
            out = model_call()
        finally:
            self._depth -= 1
        if self._depth == 0:
            self._forward(kind, fields)
        return out

    def _forward(self, kind: str, fields: Dict[str, Any]) -> None:
        if self.failed is not None:
            return
        try:
            self.live.feed(kind, fields)
        except LiveRejected as e:
            self._fail(f"RLix {self.mods.version} refused {kind} that the model took: {e}")

    # ---- inputs: the model's bookkeeping first (it raises Rejected as RLix would), then RLix
    def register(self, pipeline_id, cluster_tp_configs, cluster_device_mappings, namespace=None):
        base = super(LiveRlixModel, self)
        return self._both(
            "register",
            {
                "pipeline_id": pipeline_id,
                "cluster_tp_configs": cluster_tp_configs,
                "cluster_device_mappings": cluster_device_mappings,
                "namespace": namespace,
            },
            lambda: base.register(pipeline_id, cluster_tp_configs, cluster_device_mappings, namespace),
        )

    def admit(self, pipeline_id):
        base = super(LiveRlixModel, self)
        return self._both("admit", {"pipeline_id": pipeline_id}, lambda: base.admit(pipeline_id))

    def unregister(self, pipeline_id):
        base = super(LiveRlixModel, self)
        return self._both("unregister", {"pipeline_id": pipeline_id}, lambda: base.unregister(pipeline_id))

    def request(self, cluster_id, priority, *, global_step=None, step_target_estimate=None, lora_name=None):
        base = super(LiveRlixModel, self)
        return self._both(
            "request",
            {
                "cluster_id": cluster_id,
                "priority": priority.name,
                "global_step": global_step,
                "step_target_estimate": step_target_estimate,
                "lora_name": lora_name,
            },
            lambda: base.request(
                cluster_id,
                priority,
                global_step=global_step,
                step_target_estimate=step_target_estimate,
                lora_name=lora_name,
            ),
        )

    def release(self, cluster_id, *, global_step=None):
        base = super(LiveRlixModel, self)
        return self._both(
            "release",
            {"cluster_id": cluster_id, "global_step": global_step},
            lambda: base.release(cluster_id, global_step=global_step),
        )

    def release_then_request(
        self,
        release_cluster_id,
        request_cluster_id,
        request_priority,
        *,
        release_global_step=None,
        request_global_step=None,
        request_step_target_estimate=None,
        request_lora_name=None,
    ):
        base = super(LiveRlixModel, self)
        fields = {
            "release_cluster_id": release_cluster_id,
            "request_cluster_id": request_cluster_id,
            "request_priority": request_priority.name,
            "release_global_step": release_global_step,
            "request_global_step": request_global_step,
            "request_step_target_estimate": request_step_target_estimate,
            "request_lora_name": request_lora_name,
        }
        return self._both(
            "release_then_request",
            fields,
            lambda: base.release_then_request(
                release_cluster_id,
                request_cluster_id,
                request_priority,
                release_global_step=release_global_step,
                request_global_step=request_global_step,
                request_step_target_estimate=request_step_target_estimate,
                request_lora_name=request_lora_name,
            ),
        )

    def await_release(self, *, cluster_id=None, pipeline_id=None, global_step=None):
        base = super(LiveRlixModel, self)
        return self._both(
            "await_release",
            {"cluster_id": cluster_id, "pipeline_id": pipeline_id, "global_step": global_step},
            lambda: base.await_release(cluster_id=cluster_id, pipeline_id=pipeline_id, global_step=global_step),
        )

    def report_progress(self, report: ProgressReport, *, wire_fields=None):
        base = super(LiveRlixModel, self)
        return self._both(
            "progress",
            {
                "pipeline_id": report.pipeline_id,
                "step_target": report.step_target,
                "completed": report.completed,
                "mode": report.mode,
                "adapter": report.adapter,
            },
            lambda: base.report_progress(report, wire_fields=wire_fields),
        )

    def clear_progress(self, pipeline_id):
        base = super(LiveRlixModel, self)
        return self._both("clear_progress", {"pipeline_id": pipeline_id}, lambda: base.clear_progress(pipeline_id))

    # ---- cycles: RLix plans, both commit
    def plan_cycle(self, reason: str = "wakeup") -> Optional[CyclePlan]:
        if self.failed is not None:  # an input RLix refused failed it: the runtime's fail-fast path
            return None
        state = self.state
        cycle = state.cycle_counter + 1
        self._outbox.append({"kind": "cycle_start", "cycle": cycle, "reason": reason})
        live_plan, failure = self.live.plan()
        if live_plan is None:
            self._fail(f"RLix {self.mods.version} cycle failed: {failure}", cycle=cycle)
            return None
        plan = model_plan(live_plan)
        state.cycle_counter = cycle
        try:
            validate_plan(
                plan,
                registry=state.registry,
                allocations=state.allocations,
                idle_gpus=state.idle_gpus,
                universe=state.universe(),
            )
        except PlanValidationError as e:
            self._fail(
                f"RLix {self.mods.version}'s plan fails the model's validation: {e.condition}: {e.message}", cycle=cycle
            )
            return None
        shrink_calls, expand_calls, removes = _resize_calls(plan)
        cp = CyclePlan(cycle, reason, plan, shrink_calls, expand_calls, {p: set(r) for p, r in removes.items()})
        self._outbox.append(plan_record(cp, state))
        self._open_cycle = cp
        return cp

    def commit_cycle(self, cp: CyclePlan) -> List[Any]:
        failure = self.live.commit()
        if failure is not None and self.failed is None:
            self._open_cycle = None
            self._fail(f"RLix {self.mods.version} commit failed: {failure}", cycle=cp.cycle)
            return []
        return super().commit_cycle(cp)


#: the scheduler section's keys that choose the implementation (not options of the model)
IMPLEMENTATION_KEYS = ("implementation", "source")


def scheduler_for(topology: ClusterTopology, scheduler: Dict[str, Any]) -> SchedulerModel:
    """The model, or RLix's own scheduler when the scenario says ``implementation: rlix``."""
    options = SchedulerOptions.from_mapping({k: v for k, v in scheduler.items() if k not in IMPLEMENTATION_KEYS})
    if scheduler.get("implementation", "model") != "rlix":
        return SchedulerModel(topology, options)
    from simulators.rlix_live.loader import load_rlix

    return LiveRlixModel(topology, options, load_rlix(str(scheduler["source"])))
