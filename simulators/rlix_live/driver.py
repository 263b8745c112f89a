"""Drive RLix's own ``SchedulerImpl`` input by input and cycle by cycle, in simulated time.

RLix's scheduler is an asyncio actor: callers await ``request_gpus`` until a cycle grants
it, and its central loop runs cycles on wake-ups and a 1 s poll. Here a private event loop
is stepped by hand: an input becomes a task, run until it has either returned or is parked
on its event (as a caller would be); the central loop is never started, so a cycle runs
exactly when the input trace says one ran. A cycle is split where RLix splits it: at
``plan`` the cycle runs until it awaits its coordinators' ``resize_infer`` calls (planned,
validated, outside the lock: the window in which other inputs may land), and at
``commit`` those calls return and the cycle commits. The coordinators and the resource
manager are stand-ins registered with the stand-in Ray (:mod:`.fake_ray`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
from typing import Any, Dict, List, Optional, Tuple

from simulators.rlix_live.loader import RlixModules


class LiveRejected(Exception):
    """RLix refused an input (its call raised)."""


class _NoCentralLoop:
    """Occupies ``SchedulerImpl._loop_task`` so ``initialize`` starts no loop of its own."""

    def cancel(self) -> None:
        pass


class _ResourceManager:
    def __init__(self, num_gpus: int, gpus_per_node: int) -> None:
        self.num_gpus, self.gpus_per_node = num_gpus, gpus_per_node

    def get_num_gpus(self) -> int:
        return self.num_gpus

    def get_required_gpus_per_node(self) -> int:
        return self.gpus_per_node


class _Coordinator:
    """A pipeline coordinator's ``resize_infer``: parked until the driver commits the cycle."""

    def __init__(self, driver: "LiveScheduler") -> None:
        self.driver = driver

    def resize_infer(self, *, dp_ranks_to_remove: List[int], dp_ranks_to_add: List[int]):
        fut = self.driver.loop.create_future()
        self.driver.resizes.append(fut)
        return fut


class LiveScheduler:
    def __init__(self, mods: RlixModules, num_gpus: int, gpus_per_node: int) -> None:
        self.mods = mods
        self.loop = asyncio.new_event_loop()
        self.resizes: List[asyncio.Future] = []
        self.plans: List[Any] = []
        self.tasks: List[asyncio.Task] = []
        self.cycle_task: Optional[asyncio.Task] = None
        self.impl = mods.scheduler.SchedulerImpl()
        self.impl._loop_task = _NoCentralLoop()
        rm = mods.ray.add_actor("rlharness_resource_manager", "rlharness", _ResourceManager(num_gpus, gpus_per_node))
        self._call(self.impl.initialize(resource_manager=rm))

    # ---- stepping the loop
    def _settle(self, rounds: int = 8) -> None:
        # RLix prints [RLIX_SCHED_LOG] lines and logs warnings (a stale op skipped): the
        # differential compares decisions, so its own output stays quiet
        quiet = logging.getLogger("rlix")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                for _ in range(rounds):
                    self.loop.run_until_complete(asyncio.sleep(0))
        finally:
            quiet.setLevel(level)

    def _call(self, coro) -> Any:
        """An input: run it until it returns or parks; a raise is RLix refusing it."""
        task = self.loop.create_task(coro)
        self._settle()
        if task.done():
            if task.exception() is not None:
                raise LiveRejected(f"{type(task.exception()).__name__}: {task.exception()}")
            return task.result()
        self.tasks.append(task)
        return None

    def close(self) -> None:
        for t in self.tasks + ([self.cycle_task] if self.cycle_task else []):
            t.cancel()
        with contextlib.suppress(Exception):
            self._settle(2)
        self.loop.close()

    # ---- inputs (the replay trace's input kinds)
    def register(self, pipeline_id: str, tp: Dict[str, int], mappings: Dict[str, List[int]], namespace: str) -> None:
        prefix = self.mods.scheduler.COORDINATOR_ACTOR_NAME_PREFIX
        self.mods.ray.add_actor(f"{prefix}{pipeline_id}", namespace, _Coordinator(self))
        self._call(
            self.impl.register_pipeline(
                pipeline_id=pipeline_id,
                ray_namespace=namespace,
                cluster_tp_configs=dict(tp),
                cluster_device_mappings=dict(mappings),
            )
        )

    def feed(self, kind: str, d: Dict[str, Any]) -> None:
        P = self.mods.types.Priority
        impl = self.impl
        if kind == "register":
            self.register(
                d["pipeline_id"], d["cluster_tp_configs"], d["cluster_device_mappings"], d.get("namespace") or "ns"
            )
        elif kind == "admit":
            self._call(impl.admit_pipeline(pipeline_id=d["pipeline_id"]))
        elif kind == "unregister":
            self._call(impl.unregister_pipeline(pipeline_id=d["pipeline_id"]))
        elif kind == "request":
            self._call(
                impl.request_gpus(
                    cluster_id=d["cluster_id"],
                    priority=P[str(d["priority"])],
                    global_step=d.get("global_step"),
                    step_target_estimate=d.get("step_target_estimate"),
                    lora_name=d.get("lora_name"),
                )
            )
        elif kind == "release":
            self._call(impl.notify_release_gpus(cluster_id=d["cluster_id"], global_step=d.get("global_step")))
        elif kind == "release_then_request":
            self._call(
                impl.notify_release_then_request_gpus(
                    release_cluster_id=d["release_cluster_id"],
                    release_global_step=d.get("release_global_step"),
                    request_cluster_id=d["request_cluster_id"],
                    request_priority=P[str(d["request_priority"])],
                    request_global_step=d.get("request_global_step"),
                    request_step_target_estimate=d.get("request_step_target_estimate"),
                    request_lora_name=d.get("request_lora_name"),
                )
            )
        elif kind == "await_release":
            self._call(
                impl.await_release_gpus(
                    cluster_id=d.get("cluster_id"), pipeline_id=d.get("pipeline_id"), global_step=d.get("global_step")
                )
            )
        elif kind == "progress":
            metrics = {"completed": d["completed"], "mode": d.get("mode", "train")}
            if d.get("adapter") is not None:
                metrics["adapter_id"] = d["adapter"]
            report = self.mods.types.ProgressReport(
                pipeline_id=d["pipeline_id"], step_target_trajectories=d["step_target"], metrics=metrics
            )
            self._call(impl.report_progress(report))
        elif kind == "clear_progress":
            self._call(impl.clear_progress(pipeline_id=d["pipeline_id"]))
        else:
            raise ValueError(f"input kind {kind!r} has no RLix call")

    # ---- cycles
    def plan(self) -> Tuple[Optional[Any], Optional[str]]:
        """Start a cycle; return (its plan, or None when it failed, and the failure)."""
        sched = self.mods.scheduler
        original = sched.validate_execution_plan
        captured: List[Any] = []

        def capture(plan, **kwargs):
            captured.append(plan)
            return original(plan, **kwargs)

        sched.validate_execution_plan = capture
        try:
            self.cycle_task = self.loop.create_task(self.impl.scheduling_cycle())
            self._settle()
        finally:
            sched.validate_execution_plan = original
        failure = None
        if self.cycle_task.done() and self.cycle_task.exception() is not None:
            failure = f"{type(self.cycle_task.exception()).__name__}: {self.cycle_task.exception()}"
            self.cycle_task = None
        return (captured[-1] if captured and failure is None else None), failure

    def commit(self) -> Optional[str]:
        """Let the cycle's resize calls return and the cycle commit; its failure, if any."""
        task, self.cycle_task = self.cycle_task, None
        if task is None:
            return None
        for _ in range(4):  # shrinks, then expands, each awaited in turn
            pending, self.resizes = self.resizes, []
            for fut in pending:
                if not fut.done():
                    fut.set_result(None)
            self._settle()
            if task.done():
                break
        if not task.done():
            return "the cycle did not commit after its resize calls returned"
        return None if task.exception() is None else f"{type(task.exception()).__name__}: {task.exception()}"
