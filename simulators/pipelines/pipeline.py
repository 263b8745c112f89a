"""One simulated pipeline: interprets the harness control logic in simulated time.

``drive`` runs a control generator (``harness.control.nemo_async``, ``roll_sync``,
``resize.expand_order`` / ``shrink_order``), logging ``effect_start``/``effect_end``
around every effect and dispatching it to a handler here. Handlers cost modelled time
(``CostSpec``), move memory in the VRAM ledger, drive rank lifecycles and the router,
and call the scheduler model through the :class:`~simulators.runtime.simulation.Simulation`.
The order of anything is decided by the control logic, never here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from harness.control.context import PipelineContext
from harness.control.engine import EngineConfig, EngineTags
from harness.control.cycle import run_resize
from harness.control.effects import TRAINER_EFFECTS
from harness.control.interpret import HALT, EffectLog, interpret
from harness.control.lifecycle import pipeline_run
from harness.control.residency import TrainerSwitches
from harness.control.rank_state import RankLifecycle, RankStateError
from harness.control.resize import COORDINATOR_GONE
from harness.control.reporting import clear_progress_due
from harness.control.versions import VersionBook, VersionError
from harness.scheduler.progress import CoordinatorProgress
from harness.scheduler.types import ACTOR_TRAIN, GENERATION_CLUSTER
from simulators.pipelines.cache_lock import CacheLock
from simulators.runtime.cluster import HostOutOfMemory, OutOfMemory
from simulators.pipelines.dataplane import DataPlaneSim
from simulators.pipelines.engine_effects import EngineEffects
from simulators.runtime.env import Link
from simulators.faults.field import FieldFaults
from simulators.pipelines.decode_clock import decode_step_time, live_kv
from simulators.pipelines.inference import RankSim, Router
from simulators.pipelines.late_release import LateRelease
from simulators.pipelines.rollouts import RolloutEffects
from simulators.pipelines.scheduler_calls import SchedulerCalls
from simulators.pipelines.watchdog import GenerationWatchdog
from simulators.pipelines.training import TrainingEffects
from simulators.faults.oracle import OracleFaults
from simulators.refit.groups import WeightSyncGroups
from simulators.pipelines.ranks import RankEffects
from simulators.refit.sync import RefitEffects
from simulators.runtime.simulation import SimFailure, Simulation
from simulators.scenario.spec import PipelineSpec
from simulators.runtime.timeouts import Deadlines
from simulators.pipelines.workload import Collector, ReplayBuffer

TRANSPORT_SAME_GPU = "cpu_serialize"  # NeMo's service hard-codes it (docs/modelled-systems.md#rlix-selective-sync)


def _pipeline_context(spec: PipelineSpec, sim: Simulation, nemo: bool) -> PipelineContext:
    """The control logic's view of the pipeline (``harness.control.context``): what its
    generators read and update, the same object the gates' driver builds."""
    return PipelineContext(
        pipeline_id=spec.name,
        kind=spec.type,
        steps=spec.steps,
        sleep_level=spec.sleep_level,
        step_target=spec.workload.trajectories_per_step,
        gen_estimate=1 if nemo else spec.workload.trajectories_per_step,
        versions=VersionBook(clamp_bootstrap=nemo),
        release_after_offload=bool(sim.scenario.scheduler.get("release_after_offload", False)),
        wait_offloaded=spec.wait_offloaded,
        finalize_pause=spec.finalize_pause,
        trainer=TrainerSwitches(
            old_log_probs_offload_states=spec.old_log_probs_offload_states, offload_nccl=spec.offload_nccl
        ),
        engine=EngineConfig(pause_mode=spec.pause_mode, wake=spec.wake),
    )


class PipelineSim(
    RankEffects,
    EngineEffects,
    LateRelease,
    RefitEffects,
    TrainingEffects,
    RolloutEffects,
    FieldFaults,
    OracleFaults,
    SchedulerCalls,
    GenerationWatchdog,
):
    """Inference-rank effects come from :class:`RankEffects` (ranks.py), the weight sync from
    :class:`RefitEffects` (refit.py), training effects from :class:`TrainingEffects`
    (pipeline_training.py), workload effects and trajectory collection from
    :class:`RolloutEffects` (pipeline_rollouts.py), the field-report fault hooks from
    :class:`FieldFaults` (field_faults.py), the oracle's fault hooks from :class:`OracleFaults`
    (oracle_faults.py), the scheduler calls from :class:`SchedulerCalls` (scheduler_calls.py), the
    generation watchdog from :class:`GenerationWatchdog` (watchdog.py); lifecycle and
    coordinator-lock effects and the effect dispatch are here."""

    def __init__(self, sim: Simulation, spec: PipelineSpec, index: int) -> None:
        self.sim, self.spec, self.index = sim, spec, index
        self.env = sim.env
        self.pid = spec.name
        self.costs = spec.costs or sim.scenario.costs
        nemo = spec.type == "nemo_async"
        self.ctx = _pipeline_context(spec, sim, nemo)
        self._make_ranks_and_router(spec, index, nemo)
        self._make_collection(spec, index, nemo)
        self._init_state(spec, index)

    def _make_ranks_and_router(self, spec: PipelineSpec, index: int, nemo: bool) -> None:
        """The inference ranks (DP rank r on ``sorted(infer_gpus)[r*tp:(r+1)*tp]``) and the
        router that spreads the workload's requests over them."""
        sim = self.sim
        self.train_gpus = tuple(sorted(spec.train_gpus))
        infer = sorted(spec.infer_gpus)
        tp = spec.infer_tp
        self.ranks: Dict[int, RankSim] = {
            r: RankSim(
                self.pid,
                r,
                tuple(infer[r * tp : (r + 1) * tp]),
                RankLifecycle(self.pid, r),
                engine=EngineTags(f"{self.pid} dp{r}"),
            )
            for r in range(len(infer) // tp)
        }
        w = spec.workload
        # NeMo re-dispatches a preempted turn at most min(3, dp_size) times; ROLL migrates without limit
        attempts = min(3, len(infer) // tp) if nemo else None
        self.router = Router(
            self.env,
            self.pid,
            index,
            w.max_concurrent_per_rank,
            w.tokens_per_s_per_rank,
            w.batching_half_point,
            sim.log.add,
            self._on_trajectory,
            attempts,
            self._on_give_up,
            decode_step_time(w, spec.model),
            live_kv(w),
        )
        self.router.ranks = self.ranks

    def _make_collection(self, spec: PipelineSpec, index: int, nemo: bool) -> None:
        """Where finished trajectories go: the collector (its batch policy and random stream)
        and the replay buffer, with the coordinator's progress book."""
        sim, w = self.sim, spec.workload
        seed = np.random.SeedSequence([sim.scenario.seed, index])
        ahead = w  # fault stale_batch: generation runs two more steps ahead (oracle_faults.py)
        if any(f.name == "stale_batch" and f.pipeline == self.pid for f in sim.scenario.faults):
            ahead = dataclasses.replace(w, max_trajectory_age_steps=w.max_trajectory_age_steps + 2)
        self.collector = Collector(ahead, "async" if nemo else "sync", np.random.default_rng(seed))
        self.buffer = ReplayBuffer()
        self.progress = CoordinatorProgress(self.pid)
        self.batch_step: Optional[int] = None  # the step whose batch is being collected
        self.batch_ready = self.env.event()

    def _init_state(self, spec: PipelineSpec, index: int) -> None:
        """The coordinator lock, the per-effect caches, the training and fault state, and the
        helpers (cache lock, deadlines, data plane) that keep a reference to this pipeline."""
        sim, w = self.sim, spec.workload
        # RLix's coordinator _resize_sync_lock (a threading.Lock: no order among waiters, so
        # an explored run picks the next holder); == simpy.Resource(env, 1), cheaper (see Link)
        self.lock = Link(self.env, 1, unordered=True)
        self._lock_req: List[Any] = []
        self._handlings: Dict[type, Tuple[Any, Any]] = {}  # effect class -> how this pipeline handles it (_handling_of)
        self._run_handlers: Dict[type, Callable[[Any], Any]] = {}  # run-level effect class -> bound handler
        self.owner_gpu = self.train_gpus[0]  # cache owner: pipeline-first stage, tp0/dp0/cp0
        self.train_loaded: set = set()  # training-state kinds on the training GPUs
        self.train_comm_live = False  # training process groups exist (their buffers are resident)
        self.train_phase = "init"  # the phase whose loads are being charged (vram records' phase)
        self.leaked_train_state = False
        self.steps_done = 0
        self.finished = False
        self.gone = False  # unregistered and torn down: its coordinator is dead
        self.faults = {f.name: f.at_step for f in sim.scenario.faults if f.pipeline == self.pid}
        self.progress_hooks = "noop_progress_hooks" not in self.faults
        self._progress_suppressed = False  # fault noop_progress_hooks withheld a report (fault_fired once)
        self.weight_bytes = spec.model.weight_bytes
        # read on every completion: the frozen spec's values, looked up once
        self._per_step = w.trajectories_per_step
        self._max_age = w.max_trajectory_age_steps
        self._sync_targets_of: Dict[Tuple[int, ...], Tuple[List[int], List[int]]] = {}  # RefitEffects._sync_targets
        self._sync_plans: Dict[Tuple[int, ...], Tuple[Any, Any, Any]] = {}  # RefitEffects._sync_plan
        self._bucket_sizes_kept: Optional[Tuple[int, ...]] = None  # RefitEffects._bucket_sizes
        self.cache_versions: List[int] = []
        self.cache_lock = CacheLock(sim, self.pid, self if "lost_cache_handoff" in self.faults else None)
        self.deadlines = Deadlines(sim, self.pid, index)
        if "stamp_at_completion" in self.faults:
            self.router.stamp_at_completion = lambda: self._armed_once("stamp_at_completion")
        self._abort_hung = 0  # requests a shrink's abort left undrainable (fault abort_never_wakes)
        self.dataplane = None if spec.data_plane is None else DataPlaneSim(self, spec.data_plane)
        # one-shot field-report faults (field_faults.py) that already fired
        self._straggled = self._crashed = self._params_left = self._estimate_dropped = self._expand_failed = False
        self._active_sync_failed = False

    # ------------------------------------------------------------------ lifecycle of the pipeline
    def main(self):
        """The pipeline's process: ``harness.control.lifecycle.pipeline_run`` (the gate's
        driver runs the same generator), after the scenario's start delay."""
        try:
            if self.spec.start_s > 0:
                yield self.env.timeout(self.spec.start_s)
            if self.spec.weight_sync_groups is not None:  # the groups exist before the first sync
                groups = WeightSyncGroups(self.sim, self.index, self.pid, self.spec.weight_sync_groups)
                groups.start()
                yield groups.done
            yield from interpret(pipeline_run(self.ctx), self._handle)
        except (SimFailure, OutOfMemory, HostOutOfMemory, RankStateError, VersionError) as e:
            self._failed(self.pid, e)

    def _failed(self, where: str, e: Exception) -> None:
        """The simulated system failed: end the run, with an ``oom`` / ``host_oom`` record
        when memory ran out (a modelled failure, never an exception escaping the run)."""
        sim = self.sim
        sim.fail(f"{where}: {e}")
        if isinstance(e, OutOfMemory):
            sim.emit(
                "oom", gpu=e.gpu, owner=e.owner, mem=e.mem, requested=e.requested, used=e.used, capacity=e.capacity
            )
        elif isinstance(e, HostOutOfMemory):
            sim.emit("host_oom", node=e.node, owner=e.owner, requested=e.requested, used=e.used, capacity=e.capacity)

    def resize(self, phase: str, ranks: List[int], cycle: int):
        """A coordinator resize_infer call (runs as its own process), interpreted by
        ``harness.control.cycle.run_resize`` (which writes its resize records)."""
        yield from interpret(
            run_resize(
                self.ctx,
                phase,
                ranks,
                cycle,
                self._resize_record,
                lambda exc: self._resize_failed(phase, ranks, exc),
                self._after_expand if phase == "expand" else None,
            ),
            self._handle,
        )

    def _after_expand(self) -> None:
        if not self.gone:
            self._maybe_crash_after_refit()

    def _resize_record(self, kind: str, fields: Dict[str, Any]) -> None:
        self.sim.log.emit(kind, self.env.now, **fields)

    def _resize_failed(self, phase: str, ranks: List[int], e: Exception) -> None:
        if not isinstance(e, (SimFailure, OutOfMemory, HostOutOfMemory, RankStateError, VersionError, RuntimeError)):
            raise e
        self._failed(f"{self.pid} {phase} {ranks}", e)

    def _handle(self, effect: Any) -> Any:
        """A run-level effect (``harness.control.run_effects``): its ``_<Name>`` handler
        (looked up once per effect class: this runs for every run-level effect)."""
        cls = type(effect)
        handler = self._run_handlers.get(cls)
        if handler is None:
            handler = self._run_handlers[cls] = getattr(self, "_" + cls.__name__)
        return handler(effect)

    def _Register(self, e):
        sim = self.sim
        tps = {ACTOR_TRAIN: 1, GENERATION_CLUSTER: self.spec.infer_tp}
        maps = {ACTOR_TRAIN: list(self.train_gpus), GENERATION_CLUSTER: sorted(self.spec.infer_gpus)}
        sim.call(
            "register",
            {"pipeline_id": self.pid, "cluster_tp_configs": tps, "cluster_device_mappings": maps},
            lambda: sim.model.register(self.pid, tps, maps),
        )

    def _Admit(self, e):
        sim = self.sim
        sim.call("admit", {"pipeline_id": self.pid}, lambda: sim.model.admit(self.pid))

    def _StartWorkers(self, e):
        for g in set(self.train_gpus) | set(self.spec.infer_gpus):
            self.sim.cluster.vram.alloc(g, f"{self.pid}/ctx", "cuda_context", self.costs.cuda_context_bytes)

    def _RunControl(self, e):
        return self.drive(e.gen, e.scope, e.step, e.cycle)

    def _StepDone(self, e):
        self.steps_done += 1

    def _MarkFinished(self, e):
        self.finished = True

    def _ClearProgress(self, e):
        if clear_progress_due(self.progress) and self.progress_hooks:
            sim = self.sim
            sim.call("clear_progress", {"pipeline_id": self.pid}, lambda: sim.model.clear_progress(self.pid))

    def _GenerationHeld(self, e):
        if "keep_gen_on_finish" in self.faults:  # MILES B-13: the allocation lives until shutdown
            self.sim.emit("fault_fired", name="keep_gen_on_finish", pipeline_id=self.pid, step=self.ctx.step)
            return HALT
        alloc = self.sim.model.state.allocations.get(self._cid(GENERATION_CLUSTER))
        return alloc is not None and bool(alloc.active_dp_ranks)

    def _HoldCoordinator(self, e):
        req = self.lock.request()
        yield req
        self._lock_req.append(req)
        yield from self._hold_longer()

    def _hold_longer(self):
        """Under exploration a new lock holder may go on a small seeded delay later
        (simulators/runtime/explore.py): the lock is held that much longer."""
        explorer = self.env.explorer
        if explorer is not None:
            delay = explorer.delay()
            if delay:
                yield self.env.timeout(delay)

    def _Unregister(self, e):
        sim = self.sim
        sim.call("unregister", {"pipeline_id": self.pid}, lambda: sim.model.unregister(self.pid))
        self.gone = True

    def _Teardown(self, e):
        """The pipeline's processes die: their ranks stop, their memory (VRAM, host RAM) goes."""
        self._stop_ranks()
        sim = self.sim
        vram = sim.cluster.vram
        for g in range(len(vram.used)):
            for owner, mem in [k for k in vram.entries[g] if k[0].startswith(self.pid + "/")]:
                vram.free(g, owner, mem)
        host = sim.cluster.host
        for node in range(len(host.used)):
            for owner in [o for o in host.entries[node] if o.startswith(self.pid + "/")]:
                host.set(node, owner, 0)

    def _stop_ranks(self) -> None:
        """The unregistered pipeline's engines exit: every rank leaves routing (its in-flight
        requests are aborted and dropped with the queue: nobody will collect them) and is
        logged ``stopped``, so no output counts it as generating after the unregister."""
        self.router.stop()  # all off routing first: nothing is re-dispatched
        for rank in self.ranks.values():
            if rank.life.state.value != "asleep":
                rank.life.on("shutdown")
                self._log_rank(rank)

    def _FreeCoordinator(self, e):
        self.lock.release(self._lock_req.pop())

    def _CoordinatorAlive(self, e):
        return not self.gone

    # ------------------------------------------------------------------ the interpreter
    def drive(self, gen, scope: str, step: Optional[int], cycle: Optional[int] = None):
        """Interpret a step or resize generator, logged (``harness.control.interpret``):
        ``effect_start``, the handler, ``effect_end``.

        A handler is ``_<EffectName>``: a generator function when the effect takes simulated
        time, a plain function when it completes at once. How this pipeline handles an
        effect class is worked out once (:meth:`_handling_of`), not per effect."""
        return interpret(
            gen, self._handle_step, EffectLog(self.sim.log.add, self._now, self.pid, scope, step, cycle, self._gpus_of)
        )

    def _handle_step(self, effect: Any) -> Any:
        return self._handling_of(type(effect))[0](effect)

    def _gpus_of(self, effect: Any) -> Optional[List[int]]:
        gpus_of = self._handling_of(type(effect))[1]
        return None if gpus_of is None else gpus_of(effect)

    def _now(self) -> float:
        return self.env._now

    def _handling_of(self, effect_cls: type):
        handling = self._handlings.get(effect_cls)
        if handling is None:
            handling = self._handlings[effect_cls] = _handling_of(self, effect_cls)
        return handling

    # ------------------------------------------------------------------ coordinator lock
    def _LockCoordinator(self, e):
        req = self.lock.request()
        if not req.triggered:  # held by a resize or a sync: RLix's acquire has a deadline
            self.deadlines.arm("resize_sync_lock", self.costs.resize_lock_timeout_s, lambda: req.triggered)
        yield req
        if self.gone:  # the pipeline unregistered while this call waited: its coordinator is gone
            self.lock.release(req)
            return COORDINATOR_GONE
        self._lock_req.append(req)
        yield from self._hold_longer()
        return None

    def _UnlockCoordinator(self, e):
        self._drop_lock_waiter()  # fault lost_lock_handoff (oracle_faults.py)
        self.lock.release(self._lock_req.pop())
        return None


# ---------------------------------------------------------------------- effect dispatch
#: The GPUs an effect runs on (the effect record's "gpus").
GpusOf = Callable[[Any], List[int]]


def _handling_of(sim: "PipelineSim", effect_cls: type) -> Tuple[Callable[[Any], Any], Optional[GpusOf]]:
    """How ``sim`` handles ``effect_cls``: (bound handler, the record's "gpus" of an
    effect). Worked out on the class's first effect, then kept."""
    name = effect_cls.__name__  # == effect_name(effect)
    handler = getattr(sim, "_" + name)
    gpus_of: Optional[GpusOf] = None
    if "ranks" in {f.name for f in dataclasses.fields(effect_cls)}:
        ranks = sim.ranks  # the effect names inference ranks: their GPUs

        def gpus_of(effect: Any) -> List[int]:
            return sorted([g for r in effect.ranks for g in ranks[r].gpus])
    elif name in TRAINER_EFFECTS:
        train_gpus = sim.train_gpus  # a training-cluster effect: the trainer's GPUs

        def gpus_of(effect: Any) -> List[int]:
            return list(train_gpus)

    return (handler, gpus_of)
