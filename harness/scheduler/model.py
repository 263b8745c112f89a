"""The scheduler model: RLix's scheduler as a pure, deterministic state machine.

No clock, no I/O, no threads. Callers feed inputs (``register``, ``request``,
``release``, ...) and decide when a cycle runs; every decision is appended to an
outbox of plain records (``drain()``) that the caller stamps with a sequence number
and a time and writes to the event log. Blocking RLix calls become tickets: a call
returns at once with either a result or a pending request id, and the waiter is
released later by a :class:`~harness.scheduler.commit.Signal` from a commit.

Both runtimes drive this one object: the replay (``harness.logs.replay``), the simpy
simulator, and the dual-pipeline GPU gate.

A cycle is split like RLix's: :meth:`plan_cycle` (phases 0.5-5 under the lock),
resize execution by the caller (shrinks, then expands), :meth:`commit_cycle` (phase 6).
Inputs may arrive between the two halves, as they can in RLix's lock gap.

Deliberate deviation: a request for a cluster the pipeline never registered is
rejected at once; RLix accepts it and then fails the whole scheduler at the next cycle.
Fatal errors (plan validation, planner bounds, commit corruption, an await-release for a
vanished cluster) put the model in a failed state, error every waiter and reject further
inputs — RLix's fail-fast shutdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from harness.scheduler.commit import CommitResult, Signal, commit_cycle
from harness.scheduler.cycle import CycleFailure, CyclePlan, plan_cycle
from harness.scheduler.options import SchedulerOptions
from harness.scheduler.planner import PlannerLimitExceeded
from harness.scheduler.progress import ProgressReport
from harness.scheduler.rebalance import background_rebalance_reason
from harness.scheduler.records import jsonable, plan_record, signal_record
from harness.scheduler.state import SchedulerState
from harness.scheduler.types import (
    GENERATION_CLUSTER,
    PendingRequest,
    PlannedRelease,
    PlanValidationError,
    Priority,
    Rejected,
    generation_cluster_id,
    parse_cluster_id,
    validate_cluster_id,
)
from harness.scheduler.topology import ClusterTopology, TopologyError, build_pipeline_entry, validate_pipeline_id


@dataclass
class Ticket:
    """What a (possibly blocking) call returns now."""

    request_id: int
    done: bool
    gpus: List[int]


class SchedulerModel:
    def __init__(self, topology: ClusterTopology, options: Optional[SchedulerOptions] = None) -> None:
        self.topology = topology
        self.options = options or SchedulerOptions()
        self.state = SchedulerState(num_gpus=topology.num_gpus)
        self.failed: Optional[str] = None
        self._outbox: List[Dict[str, Any]] = []
        self._open_cycle: Optional[CyclePlan] = None

    # ------------------------------------------------------------------ outbox
    def drain(self) -> List[Dict[str, Any]]:
        out, self._outbox = self._outbox, []
        return out

    def _emit(self, kind: str, **fields: Any) -> None:
        self._outbox.append({"kind": kind, **fields})

    def _check_alive(self) -> None:
        if self.failed is not None:
            raise Rejected(f"scheduler has failed fast ({self.failed})")

    def _new_request_id(self) -> int:
        rid = self.state.next_request_id
        self.state.next_request_id += 1
        return rid

    # ------------------------------------------------------------------ registration
    def register(
        self,
        pipeline_id: str,
        cluster_tp_configs: Dict[str, int],
        cluster_device_mappings: Dict[str, List[int]],
        namespace: Optional[str] = None,
    ) -> None:
        self._check_alive()
        try:
            entry = build_pipeline_entry(
                pipeline_id,
                namespace or f"pipeline_{pipeline_id}_NS",
                cluster_tp_configs,
                cluster_device_mappings,
                self.topology,
            )
        except TopologyError as e:
            raise Rejected(str(e)) from None
        self.state.registry[entry.pipeline_id] = entry  # RLix overwrites a re-registration
        self.state.registry_changed()

    def admit(self, pipeline_id: str) -> None:
        self._check_alive()
        entry = self.state.registry.get(pipeline_id)
        if entry is None:
            raise Rejected(f"pipeline {pipeline_id} must be registered before admission")
        entry.admitted = True

    def unregister(self, pipeline_id: str) -> List[Signal]:
        self._check_alive()
        try:
            validate_pipeline_id(pipeline_id)
        except TopologyError as e:
            raise Rejected(str(e)) from None
        st = self.state
        st.registry.pop(pipeline_id, None)
        st.progress.clear(pipeline_id)
        st.registry_changed()
        for cid in [c for c in st.allocations if parse_cluster_id(c)[0] == pipeline_id]:
            alloc = st.allocations.pop(cid)
            st.idle_gpus |= set(alloc.gpu_ids)
            self._emit("released", cluster_id=cid, gpus=sorted(alloc.gpu_ids), reason="unregister")
        signals: List[Signal] = []
        error = f"Pipeline {pipeline_id!r} unregistered"
        for prio in Priority:
            keep = []
            for p in st.pending[prio]:
                if parse_cluster_id(p.cluster_id)[0] == pipeline_id:
                    signals.append(Signal(p.request_id, "request", p.cluster_id, prio, [], None, error))
                else:
                    keep.append(p)
            st.pending[prio] = keep
        for cid in [c for c in st.held_for if parse_cluster_id(c)[0] == pipeline_id]:
            del st.held_for[cid]
        for cid in [c for c in st.planned_releases if parse_cluster_id(c)[0] == pipeline_id]:
            req = st.planned_releases.pop(cid)
            signals.append(Signal(req.request_id, "planned_release", cid, Priority.GENERATION, [], None, error))
        for s in signals:
            self._emit(**signal_record(s))
        return signals

    # ------------------------------------------------------------------ requests
    def _admitted_pipeline(self, cluster_id: str):
        """RLix's first checks of a request (rlix/scheduler/scheduler.py ``request_gpus``,
        ``notify_release_then_request_gpus``): the id's form, registered, admitted."""
        try:
            validate_cluster_id(cluster_id)
            pid, name = parse_cluster_id(cluster_id)
        except ValueError as e:
            raise Rejected(str(e)) from None
        entry = self.state.registry.get(pid)
        if entry is None:
            raise Rejected(f"pipeline_id {pid!r} not registered")
        if not entry.admitted:
            raise Rejected(f"pipeline_id {pid!r} not admitted")
        return pid, name

    def _registered_cluster(self, cluster_id: str) -> None:
        """The model's one check RLix lacks: a request names a cluster its pipeline
        registered (RLix enqueues it and fails later, in planning). Made where RLix would
        enqueue, so every refusal RLix also makes comes first, in RLix's order, and a
        release-then-request's release sticks as in RLix."""
        pid, name = parse_cluster_id(cluster_id)
        if name not in self.state.registry[pid].clusters:
            raise Rejected(f"cluster {name} is not registered for pipeline {pid}")

    def _enqueue(self, cluster_id: str, priority: Priority, global_step, estimate, lora_name) -> Ticket:
        st = self.state
        if st.pending_for(cluster_id) is not None:
            raise Rejected(f"Duplicate pending request for cluster_id={cluster_id!r} is not supported")
        self._registered_cluster(cluster_id)
        st.request_seq += 1
        rid = self._new_request_id()
        st.pending[priority].append(
            PendingRequest(rid, cluster_id, priority, st.request_seq, global_step, estimate, lora_name)
        )
        self._emit("enqueued", request_id=rid, cluster_id=cluster_id, priority=priority.name)
        return Ticket(rid, False, [])

    def request(
        self,
        cluster_id: str,
        priority: Priority,
        *,
        global_step: Optional[int] = None,
        step_target_estimate: Optional[int] = None,
        lora_name: Optional[str] = None,
    ) -> Ticket:
        self._check_alive()
        self._admitted_pipeline(cluster_id)
        existing = self.state.allocations.get(cluster_id)
        if existing is not None:
            if existing.priority != priority:
                raise Rejected(
                    f"cluster_id {cluster_id!r} already allocated with priority={existing.priority.name}, requested priority={priority.name}"
                )
            live = existing.active_dp_ranks if priority == Priority.GENERATION else existing.gpu_ids
            if live:
                rid = self._new_request_id()
                self._emit(**signal_record(Signal(rid, "request", cluster_id, priority, list(existing.gpu_ids), None)))
                return Ticket(rid, True, list(existing.gpu_ids))
        return self._enqueue(cluster_id, priority, global_step, step_target_estimate, lora_name)

    def release(self, cluster_id: str, *, global_step: Optional[int] = None) -> List[int]:
        self._check_alive()
        alloc = self.state.allocations.pop(cluster_id, None)
        if alloc is None:
            raise Rejected(f"cluster_id {cluster_id!r} not found in active_allocations")
        self.state.idle_gpus |= set(alloc.gpu_ids)
        self._emit("released", cluster_id=cluster_id, gpus=sorted(alloc.gpu_ids), reason="release")
        return sorted(alloc.gpu_ids)

    def release_then_request(
        self,
        release_cluster_id: str,
        request_cluster_id: str,
        request_priority: Priority,
        *,
        release_global_step: Optional[int] = None,
        request_global_step: Optional[int] = None,
        request_step_target_estimate: Optional[int] = None,
        request_lora_name: Optional[str] = None,
    ) -> Ticket:
        """Atomic release + enqueue. As in RLix the release sticks even if the enqueue is refused."""
        self._check_alive()
        self._admitted_pipeline(request_cluster_id)
        existing = self.state.allocations.get(release_cluster_id)
        if existing is None:
            raise Rejected(f"release_cluster_id {release_cluster_id!r} is not currently allocated")
        if existing.priority == request_priority:
            raise Rejected(
                f"release_cluster_id {release_cluster_id!r} priority is already {existing.priority.name}; releasing and re-requesting the same priority is a no-op"
            )
        released = list(existing.gpu_ids)
        self.release(release_cluster_id, global_step=release_global_step)
        ticket = self._enqueue(
            request_cluster_id, request_priority, request_global_step, request_step_target_estimate, request_lora_name
        )
        if self.options.reserve_same_cluster_release and release_cluster_id == request_cluster_id and not ticket.done:
            self.state.held_for[request_cluster_id] = set(released)
        return ticket

    def await_release(
        self, *, cluster_id: Optional[str] = None, pipeline_id: Optional[str] = None, global_step: Optional[int] = None
    ) -> Ticket:
        """Planned shrink-to-zero of a GENERATION cluster; acked at the next commit."""
        self._check_alive()
        if (cluster_id is None) == (pipeline_id is None):
            raise Rejected("exactly one of pipeline_id or cluster_id must be provided")
        cid = cluster_id if cluster_id is not None else generation_cluster_id(str(pipeline_id))
        st = self.state
        alloc = st.allocations.get(cid)
        if alloc is None:
            raise Rejected(f"cluster_id {cid!r} not found in active_allocations")
        if alloc.priority != Priority.GENERATION:
            raise Rejected(f"await_release_gpus only supports GENERATION clusters, got {cid!r}")
        if not alloc.active_dp_ranks:
            rid = self._new_request_id()
            self._emit(
                **signal_record(
                    Signal(rid, "planned_release", cid, Priority.GENERATION, [], None, shrink_executed=True)
                )
            )
            return Ticket(rid, True, [])
        existing = st.planned_releases.get(cid)
        if existing is not None:
            return Ticket(existing.request_id, False, [])  # idempotent: wait on the same release
        if parse_cluster_id(cid)[1] != GENERATION_CLUSTER:
            raise Rejected(f"await_release_gpus only supports actor_infer clusters, got {cid!r}")
        rid = self._new_request_id()
        st.planned_releases[cid] = PlannedRelease(rid, cid, sorted(alloc.active_dp_ranks), global_step)
        self._emit("release_pending", request_id=rid, cluster_id=cid, dp_ranks=sorted(alloc.active_dp_ranks))
        return Ticket(rid, False, [])

    # ------------------------------------------------------------------ progress
    def report_progress(self, report: ProgressReport, *, wire_fields: Optional[Dict[str, Any]] = None) -> None:
        """RLix's check order (rlops/rlix, rlix/scheduler/scheduler.py ``report_progress``):
        the pipeline id's form, then the target (outside the lock), then the registry,
        then the metrics; so a report of an unregistered pipeline with target 0 is refused
        on its target, as RLix refuses it."""
        self._check_alive()
        try:
            validate_pipeline_id(report.pipeline_id)
        except TopologyError as e:
            raise Rejected(str(e)) from None
        if not isinstance(report.step_target, int) or report.step_target <= 0:
            raise Rejected(f"step_target_trajectories must be > 0, got {report.step_target!r}")
        if report.pipeline_id not in self.state.registry:
            raise Rejected(f"pipeline_id {report.pipeline_id!r} not registered")
        self.state.progress.report(report, wire_fields=wire_fields)

    def clear_progress(self, pipeline_id: str) -> None:
        """RLix checks only the id's form: clearing an unregistered pipeline is a no-op."""
        self._check_alive()
        try:
            validate_pipeline_id(pipeline_id)
        except TopologyError as e:
            raise Rejected(str(e)) from None
        self.state.progress.clear(pipeline_id)

    # ------------------------------------------------------------------ cycles
    def plan_cycle(self, reason: str = "wakeup") -> Optional[CyclePlan]:
        """Phases 0.5-5. Returns None (and fails fast) on a fatal error."""
        self._check_alive()
        if self._open_cycle is not None:
            raise Rejected(f"cycle {self._open_cycle.cycle} is still open; commit it first (cycles are serial)")
        cycle = self.state.cycle_counter + 1
        # Records of the per-cycle path are appended as built (what _emit builds, without
        # the keyword packing): plan_record and signal_record already put "kind" first.
        outbox = self._outbox
        outbox.append({"kind": "cycle_start", "cycle": cycle, "reason": reason})
        try:
            cp = plan_cycle(self.state, self.options, reason=reason)
        except PlanValidationError as e:
            self._emit(
                "validation_failed", cycle=cycle, condition=e.condition, message=e.message, context=jsonable(e.context)
            )
            self._fail(f"plan validation failed: condition {e.condition}: {e.message}")
            return None
        except (CycleFailure, PlannerLimitExceeded) as e:
            self._fail(str(e), cycle=cycle)
            return None
        outbox.append(plan_record(cp, self.state))
        self._open_cycle = cp
        return cp

    def commit_cycle(self, cp: CyclePlan) -> List[Signal]:
        if self._open_cycle is not cp:
            raise Rejected("commit_cycle needs the plan returned by the last plan_cycle")
        self._open_cycle = None
        if self.failed is not None:
            return []
        try:
            result: CommitResult = commit_cycle(self.state, cp, self.options)
        except CycleFailure as e:
            self._fail(str(e), cycle=cp.cycle)
            return []
        outbox = self._outbox
        for s in result.signals:
            outbox.append(signal_record(s))
        outbox.append(
            {
                "kind": "commit",
                "cycle": cp.cycle,
                "idle_gpus": len(self.state.idle_gpus),
                "skipped_stale": result.skipped_stale,
            }
        )
        return result.signals

    def resize_records(self, cp: CyclePlan, phase: str, edge: str) -> None:
        """Emit resize_start/resize_end records for one phase ("shrink"/"expand")."""
        calls = cp.shrink_calls if phase == "shrink" else cp.expand_calls
        for c in calls:
            ranks = c.dp_ranks_to_remove if phase == "shrink" else c.dp_ranks_to_add
            self._emit(f"resize_{edge}", cycle=cp.cycle, pipeline_id=c.pipeline_id, phase=phase, dp_ranks=list(ranks))

    def run_cycle(self, reason: str = "wakeup") -> List[Signal]:
        """Plan, execute resizes instantly (all shrinks, then all expands), commit."""
        cp = self.plan_cycle(reason)
        if cp is None:
            return []
        for phase in ("shrink", "expand"):
            self.resize_records(cp, phase, "start")
            self.resize_records(cp, phase, "end")
        return self.commit_cycle(cp)

    def _fail(self, reason: str, cycle: Optional[int] = None) -> None:
        """RLix fail-fast: error every waiter, refuse everything after."""
        self.failed = reason
        st = self.state
        error = f"scheduler_loop_failed: {reason}"
        self._emit("scheduler_failed", cycle=cycle, reason=reason)
        for prio in Priority:
            for p in st.pending[prio]:
                self._emit(**signal_record(Signal(p.request_id, "request", p.cluster_id, prio, [], None, error)))
            st.pending[prio] = []
        for cid, req in st.planned_releases.items():
            self._emit(
                **signal_record(Signal(req.request_id, "planned_release", cid, Priority.GENERATION, [], None, error))
            )
        st.planned_releases.clear()

    # ------------------------------------------------------------------ background rebalance
    def background_rebalance_reason(self) -> Optional[str]:
        """RLix's 1 s poll trigger (docs/modelled-systems.md#rlix-scheduling-loop-and-background-rebalance): "2.2" (suspended GEN cluster with demand),
        "2.1" (worst-half demand/GPU share deviates > threshold), or None (also once the model failed)."""
        if self.failed is not None:
            return None
        return background_rebalance_reason(self.state, self.options)

    # ------------------------------------------------------------------ views
    def snapshot(self) -> Dict[str, Any]:
        """A JSON-able view of ownership, for invariant checks and tests."""
        st = self.state
        return {
            "idle": sorted(st.idle_gpus),
            "allocations": {
                cid: {
                    "priority": a.priority.name,
                    "gpus": sorted(a.gpu_ids),
                    "active_dp_ranks": sorted(a.active_dp_ranks),
                }
                for cid, a in st.allocations.items()
            },
        }
