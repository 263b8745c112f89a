"""A ``disaggregated`` pipeline in simulated time: training on ``train_gpus``, generation on
``infer_gpus`` (disjoint), no RLix scheduler (the pipeline owns its GPUs for the run, as a
single controller does). The orders and the rules are ``harness.control.disaggregated``'s;
this module charges their time:

* **generation**: each trajectory's decode length is drawn by the workload's
  :class:`~simulators.pipelines.workload.Collector` (the log-normal, the cap); a rank runs at most
  ``max_concurrent_per_rank`` at once (the rest queue, as vLLM's waiting queue) and decodes
  step by step: every running sequence advances one token per decode step, a step at ``c``
  running sequences taking ``t(c)`` (``simulators.pipelines.decode_clock.decode_step_time``: the batching
  curve's ``(h + c)/T``, less the experts no token reads). A batch's tail is its longest
  answer decoding alone at ``t(1)``.
* **training**: the batch's log-probs and training pass at the cost fields' rate over the
  training GPUs (as ``PipelineSim._Compute``).
* **weight sync**: the weights from the trainer to the generation GPUs over the slowest link
  between them (the NICs when they span nodes), plus ``finalize_s``, as the single
  controller's ``SyncWeights``.

Each trajectory's completion is a ``trajectory`` record with the weight versions it started
and ended with (a partial rollout spans more than one); each trained batch a
``batch_consumed`` record with its staleness histogram (the trajectory_age check reads it against the
order's bound, ``trajectory_age_bound``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, List, Optional, Tuple

import numpy as np

from harness.control import disaggregated as order
from harness.control.interpret import EffectLog, interpret
from harness.control.effects import TRAINER_EFFECTS
from simulators.pipelines.comm_locks import CommLocks
from simulators.runtime.cluster import OutOfMemory
from simulators.runtime.env import Actor, Timer
from simulators.pipelines.decode_clock import decode_step_time, live_kv, time_for, tokens_in
from simulators.runtime.simulation import SimFailure, Simulation
from simulators.pipelines.single_controller import hold_own_gpus, weight_sync_s
from simulators.scenario.spec import PipelineSpec
from simulators.pipelines.workload import Collector

_EPS = 1e-9


class _Rank:
    """One generation DP rank: a token clock shared by its running sequences."""

    __slots__ = ("index", "gpus", "running", "queue", "clock", "last_t", "paused", "armed", "ctx0", "k")

    def __init__(self, index: int, gpus: Tuple[int, ...]) -> None:
        self.index, self.gpus = index, gpus
        self.running: Dict[int, float] = {}  # trajectory -> the clock value it finishes at
        self.queue: Deque[Tuple[int, int]] = deque()  # (trajectory, tokens) waiting for a slot
        self.clock = 0.0  # tokens decoded by each running sequence since the rank started
        self.last_t = 0.0
        self.paused = False
        self.armed = 0  # the live timer's number (a re-arm makes older timers stale)
        # live KV (decode_clock.LiveKv): each running trajectory's context less the clock it
        # started at, and their sum
        self.ctx0: Dict[int, float] = {}
        self.k = 0.0


class DisaggregatedSim:
    def __init__(self, sim: Simulation, spec: PipelineSpec, index: int) -> None:
        self.sim, self.spec, self.index = sim, spec, index
        self.env = sim.env
        self.pid = spec.name
        self.costs = spec.costs or sim.scenario.costs
        self.shape, self.weight_sync = spec.disaggregated.shape, spec.disaggregated.weight_sync
        self.by_target = self.shape == "fully_async" and spec.disaggregated.batching == "target"
        w = spec.workload
        self.batch = w.prompts_per_step * w.generations_per_prompt
        self.max_age = order.trajectory_age_bound(self.shape, w.max_trajectory_age_steps)
        self.train_gpus = tuple(sorted(spec.train_gpus))
        infer, tp = sorted(spec.infer_gpus), spec.infer_tp
        self.ranks = [_Rank(r, tuple(infer[r * tp : (r + 1) * tp])) for r in range(len(infer) // tp)]
        self.cap = w.max_concurrent_per_rank
        step = decode_step_time(w, spec.model)
        T, h = w.tokens_per_s_per_rank, w.batching_half_point
        self.step_s = step if step is not None else (lambda c: (h + c) / T)
        self.live_kv = live_kv(w)
        self.collector = Collector(w, "sync", np.random.default_rng(np.random.SeedSequence([sim.scenario.seed, index])))
        self.actor = Actor("pipeline", index, 4)
        # the field faults of a fully asynchronous pipeline (simulators/scenario/fault_catalogue.py FaultSpec)
        self.faults: Dict[str, Any] = {f.name: f.at_step for f in sim.scenario.faults if f.pipeline == self.pid}
        self.steps_done = 0
        self.gen_version = 0  # the weights the generation GPUs hold
        self.trainer_version = 0
        self.admitting = True
        self.started = 0  # trajectories started (fully_async's window)
        self.dropped = 0
        self.first_version: Dict[int, int] = {}
        self.batch_of: Dict[int, int] = {}  # trajectory -> its batch (sync, one_step_off)
        self.left: Dict[int, int] = {}  # batch -> trajectories not yet complete
        self.batch_version: Dict[int, int] = {}
        self.completed: List[Tuple[int, int]] = []  # fully_async: (trajectory, first version) done, not trained
        # batching target (NeMo RL): groups spawned / not complete, each trajectory's group, a
        # group's answers not back, the first versions of a target's completed trajectories
        self.groups_started, self.groups_running = 0, 0
        self.group_of: Dict[int, int] = {}
        self.group_left: Dict[int, int] = {}
        self.target_versions: Dict[int, List[int]] = {}
        self._changed = self.env.event()
        self._busy: set = set()  # ranks with a Generate effect open
        # disaggregated.comm_locks: a lock per communicator, the sync beside the trainer (comm_locks.py)
        self.locks = CommLocks(sim, self.pid) if spec.disaggregated.comm_locks else None
        self._sync_landed = None  # the event of the sync running beside the trainer

    # ------------------------------------------------------------------ process
    def main(self):
        try:
            if self.spec.start_s > 0:
                yield self.env.timeout(self.spec.start_s)
            self._setup()
            steps = self.spec.steps
            if self.shape == "fully_async":
                rollouter = self._target_rollouter() if self.by_target else self._rollouter()
                self.env.spawn(rollouter, "pipeline", self.index, 1)
                orders = order.fully_async(steps, self.weight_sync)
            else:
                orders = order.sync(steps) if self.shape == "sync" else order.one_step_off(steps)
            for step, gen in orders:
                log = EffectLog(self.sim.log.add, lambda: self.env._now, self.pid, "step", step, None, self._gpus_of)
                yield from interpret(gen, self._handle, log)
                self.steps_done += 1
        except (SimFailure, OutOfMemory, RuntimeError) as e:
            self.sim.fail(f"{self.pid}: {e}")
        self.admitting = False
        for rank in self.ranks:  # what still runs when the last step is trained is abandoned
            if rank.index in self._busy:
                self._generate_record(rank, "effect_end")
            rank.armed += 1
        self._busy.clear()
        self._notify()

    def resize(self, phase, ranks, cycle):  # pragma: no cover - never registered with the scheduler
        raise RuntimeError(f"{self.pid}: a disaggregated pipeline is not resized by the scheduler")

    def _setup(self) -> None:
        hold_own_gpus(self.sim, self.pid, self.costs, self.spec, self.train_gpus, [r.gpus for r in self.ranks])

    def _handle(self, effect: Any) -> Any:
        """The handler ``_<EffectName>`` (a generator when the effect takes simulated time;
        the one interpreter runs it either way)."""
        return getattr(self, "_" + type(effect).__name__)(effect)

    def _gpus_of(self, effect: Any) -> Optional[List[int]]:
        name = type(effect).__name__
        if name in TRAINER_EFFECTS:
            return list(self.train_gpus)
        if name == "SyncWeights":
            return sorted(self.train_gpus + tuple(g for r in self.ranks for g in r.gpus))
        return None

    def _notify(self) -> None:
        if not self._changed.triggered:
            self._changed.succeed()
        self._changed = self.env.event()

    # ------------------------------------------------------------------ trainer effects
    def _StartRollout(self, e):
        if self._sync_landed is not None and not self._sync_landed.triggered:
            # verl's one-step-off generates the batch once the sync landed; the trainer goes on
            self.env.spawn(self._start_after_sync(e), "pipeline", self.index, 3)
            return None
        reqs = self.collector.draw(self.batch)
        self.left[e.batch] = len(reqs)
        self.batch_version[e.batch] = e.version
        for req in reqs:
            self.batch_of[req.rid] = e.batch
            self._dispatch(req.rid, req.tokens)
        return None

    def _WaitBatch(self, e):
        self._maybe_restart_window(e.global_step)
        if self.by_target:
            while self.left.get(e.global_step, self.batch):
                yield self._changed
            ages = {}
            for v in self.target_versions.pop(e.global_step):
                ages[self.trainer_version - v] = ages.get(self.trainer_version - v, 0) + 1
            dropped = []
        elif self.shape == "fully_async":
            dropped: List[int] = []
            while True:
                taken, gone = order.select_batch(self.completed, self.trainer_version, self.batch, self.max_age)
                if gone:  # evicted now: the rollouter's window starts their replacements
                    self.sim.emit(
                        "trajectory_evicted",
                        pipeline_id=self.pid,
                        trajectories=gone,
                        trainer_version=self.trainer_version,
                    )
                    dropped += gone
                    self.dropped += len(gone)
                    self.completed = [(t, v) for t, v in self.completed if t not in set(gone)]
                    self._notify()
                if taken is not None:
                    break
                yield self._changed
            ages: Dict[int, int] = {}
            for t, v in self.completed:
                if t in taken:
                    ages[self.trainer_version - v] = ages.get(self.trainer_version - v, 0) + 1
            self.completed = [(t, v) for t, v in self.completed if t not in set(taken)]
        else:
            while self.left.get(e.global_step, 1):
                yield self._changed
            ages = {self.trainer_version - self.batch_version[e.global_step]: self.batch}
            dropped = []
        self.sim.emit(
            "batch_consumed",
            pipeline_id=self.pid,
            step=e.global_step,
            trajectories=sum(ages.values()),
            staleness={str(k): v for k, v in sorted(ages.items())},
            **({"dropped": len(dropped)} if dropped else {}),
        )
        return None

    def _Compute(self, e):
        c, n = self.costs, self.batch
        if e.what == "train":
            dt = c.train_fixed_s + c.train_s_per_trajectory * n / len(self.train_gpus)
        else:
            dt = c.old_log_probs_s_per_trajectory * n / len(self.train_gpus)
        if self.locks is not None:
            yield from self.locks.issue(e.what, self.locks.order(False), dt)
        else:
            self._collectives(e.what, "start")
            yield self.env.timeout(dt)
            self._collectives(e.what, "end")
        if e.what == "train":
            self.trainer_version += 1
            self._notify()
        return None

    def _SyncWeights(self, e):
        if self.locks is not None:
            self._sync_landed = self.env.event()
            self.env.spawn(self._locked_sync(e.version), "pipeline", self.index, 2)
            return None
        if self._sync_off_thread():
            self.env.spawn(self._sync(e.version), "pipeline", self.index, 2)
            return None
        yield from self._sync(e.version)
        return None

    def _sync(self, version: int):
        self._collectives("weight_sync", "start")
        yield self.env.timeout(
            weight_sync_s(self.sim.cluster, self.spec, self.costs, self.train_gpus, [r.gpus for r in self.ranks])
        )
        self._collectives("weight_sync", "end")
        self.gen_version = version  # in_flight: the running sequences go on with these weights
        if self.by_target:
            self._notify()  # the generation's version gates the next target's groups

    def _locked_sync(self, version: int):
        """The sync beside the trainer under the communicators' locks; fault
        ``comm_locks_inverted`` takes them in the other order (comm_locks.py)."""
        at = self.faults.get("comm_locks_inverted")
        inverted = at is not None and self.steps_done >= at
        if inverted and not self.__dict__.get("_inverted_fired"):
            self._inverted_fired = True
            self.sim.emit("fault_fired", name="comm_locks_inverted", pipeline_id=self.pid, step=self.steps_done)
        gpus = [r.gpus for r in self.ranks]
        seconds = weight_sync_s(self.sim.cluster, self.spec, self.costs, self.train_gpus, gpus)
        yield from self.locks.issue("weight_sync", self.locks.order(inverted), seconds)
        self.gen_version = version
        self._sync_landed.succeed()

    def _start_after_sync(self, e):
        yield self._sync_landed
        self._StartRollout(e)

    def _collectives(self, activity: str, phase: str) -> None:
        """The trainer's log-probs, training and weight sync all issue collectives on the
        training side's model-parallel communicator (verl's PP/EP groups): logged per
        activity, so that ``collective_order`` sees two of them interleave."""
        self.sim.emit(
            "collectives", pipeline_id=self.pid, communicator=f"{self.pid}/train", activity=activity, phase=phase
        )

    def _PauseGeneration(self, e):
        self.admitting = False
        if e.mode == "drain" and self._requeues_partial():
            e = order.PauseGeneration("pause")
        if e.mode == "drain":
            while any(r.running or r.queue for r in self.ranks):
                yield self._changed
        else:
            for rank in self.ranks:
                self._advance(rank)
                rank.paused = True
                rank.armed += 1  # its pending completion is off until the resume
        return None

    def _ResumeGeneration(self, e):
        self.admitting = True
        for rank in self.ranks:
            if rank.paused:
                rank.paused = False
                rank.last_t = self.env._now
                self._arm(rank)
        self._notify()
        return None

    # ------------------------------------------------------------------ rollouter (fully_async)
    def _rollouter(self):
        total = self.spec.steps * self.batch
        while self.steps_done < self.spec.steps and not self.sim.stop.triggered:
            if self.admitting and order.may_admit(
                self.started - self.dropped, self.trainer_version, self.batch, self.max_age, total
            ):
                req = self.collector.draw(1)[0]
                self.started += 1
                self._dispatch(req.rid, req.tokens)
                continue
            yield self._changed

    def _target_rollouter(self):
        """NeMo RL's trajectory collector (``order.may_start_group``): a prompt group at a
        time, each for the step ``order.target_of`` names, its slot held until its last
        answer is back; none starts while a sync pauses generation (``prepare_for_refit``)."""
        w = self.spec.workload
        total = self.spec.steps * w.prompts_per_step
        while self.steps_done < self.spec.steps and not self.sim.stop.triggered:
            if self.admitting and order.may_start_group(
                self.groups_started, self.groups_running, self.gen_version, w.prompts_per_step, self.max_age, total
            ):
                group, target = self.groups_started, order.target_of(self.groups_started, w.prompts_per_step)
                self.groups_started += 1
                self.groups_running += 1
                reqs = self.collector.draw(w.generations_per_prompt)
                self.group_left[group] = len(reqs)
                self.left.setdefault(target, self.batch)
                self.target_versions.setdefault(target, [])
                for req in reqs:
                    self.batch_of[req.rid], self.group_of[req.rid] = target, group
                    self.started += 1
                    self._dispatch(req.rid, req.tokens)
                continue
            yield self._changed

    # ------------------------------------------------------------------ field faults
    def _requeues_partial(self) -> bool:
        """Fault ``requeue_ignores_partial_rollout`` (THUDM/slime #2092): from its step on,
        a weight sync of a pipeline without partial rollouts (``weight_sync: drain``)
        interrupts the running trajectories and requeues them with their tokens, so that
        they go on with the new weights: one trajectory spans several weight versions."""
        at = self.faults.get("requeue_ignores_partial_rollout")
        if at is None or self.steps_done < at:
            return False
        self.sim.emit("fault_fired", name="requeue_ignores_partial_rollout", pipeline_id=self.pid, step=self.steps_done)
        return True

    def _sync_off_thread(self) -> bool:
        """Fault ``weight_sync_off_thread`` (volcengine/verl #7423): from its step on, the
        weight sync runs on the event loop while the trainer goes on in its thread pool,
        nothing ordering the two: the next step's log-probs and training issue collectives
        on the communicator the sync is still using."""
        at = self.faults.get("weight_sync_off_thread")
        if at is None or self.steps_done < at:
            return False
        self.sim.emit("fault_fired", name="weight_sync_off_thread", pipeline_id=self.pid, step=self.steps_done)
        return True

    def _maybe_restart_window(self, step: int) -> None:
        """Fault ``staleness_capacity_reset`` (inclusionAI/AReaL #1388): at its step the
        rollouter recovers from a restart with the trainer's version restored but its count
        of started trajectories at zero, so its staleness capacity admits another whole
        window on top of the trajectories already running or waiting to be trained."""
        if self.faults.get("staleness_capacity_reset") != step:
            return
        self.started = self.dropped  # the window's count (started less dropped) restarts at zero
        self.sim.emit("fault_fired", name="staleness_capacity_reset", pipeline_id=self.pid, step=step)
        self._notify()

    # ------------------------------------------------------------------ decode, step by step
    def _dispatch(self, tid: int, tokens: int) -> None:
        self.sim.emit("trajectory_dispatch", pipeline_id=self.pid, trajectory=tid, trainer_version=self.trainer_version)
        rank = min(self.ranks, key=lambda r: (len(r.running) + len(r.queue), r.index))
        rank.queue.append((tid, tokens))
        self._fill(rank)

    def _fill(self, rank: _Rank) -> None:
        """Queued sequences take free slots; the rank's clock is re-timed."""
        self._advance(rank)
        while rank.queue and len(rank.running) < self.cap:
            tid, tokens = rank.queue.popleft()
            rank.running[tid] = rank.clock + tokens
            if self.live_kv is not None:
                rank.ctx0[tid] = self.live_kv.prompt - rank.clock
                rank.k += rank.ctx0[tid]
            self.first_version[tid] = self.gen_version
        if rank.running and rank.index not in self._busy:
            self._busy.add(rank.index)
            self._generate_record(rank, "effect_start")
        self._arm(rank)

    def _live_b(self, rank: _Rank, c: int) -> float:
        """The step of the ``c`` running trajectories at the clock's current value (live KV)."""
        kv = self.live_kv
        return kv.base(self.step_s(c), c) + kv.s_per_token * (rank.k + c * rank.clock)

    def _advance(self, rank: _Rank) -> None:
        now = self.env._now
        if rank.running and not rank.paused:
            c = len(rank.running)
            if self.live_kv is None:
                rank.clock += (now - rank.last_t) / self.step_s(c)
            else:
                rank.clock += tokens_in(now - rank.last_t, self._live_b(rank, c), self.live_kv.s_per_token, c)
        rank.last_t = now

    def _arm(self, rank: _Rank) -> None:
        rank.armed += 1
        if not rank.running or rank.paused:
            return
        left, c = max(0.0, min(rank.running.values()) - rank.clock), len(rank.running)
        if self.live_kv is None:
            delay = left * self.step_s(c)
        else:
            delay = time_for(left, self._live_b(rank, c), self.live_kv.s_per_token, c)
        Timer(self.env, delay, self.actor, self._fire, (rank, rank.armed))

    def _fire(self, arg) -> None:
        rank, armed = arg
        if armed != rank.armed:
            return
        self._advance(rank)
        done = sorted(t for t, mark in rank.running.items() if mark <= rank.clock + _EPS)
        for tid in done:
            del rank.running[tid]
            rank.k -= rank.ctx0.pop(tid, 0.0)
            self._complete(rank, tid)
        self._fill(rank)
        if not rank.running:
            self._busy.discard(rank.index)
            self._generate_record(rank, "effect_end")
        self._notify()

    def _complete(self, rank: _Rank, tid: int) -> None:
        first = self.first_version.pop(tid)
        self.sim.emit(
            "trajectory",
            pipeline_id=self.pid,
            trajectory=tid,
            dp_rank=rank.index,
            first_version=first,
            version=self.gen_version,
        )
        batch = self.batch_of.pop(tid, None)
        if batch is not None:
            self.left[batch] -= 1
            if self.by_target:
                self._group_answer_back(tid, batch, first)
        else:
            self.completed.append((tid, first))

    def _group_answer_back(self, tid: int, target: int, first: int) -> None:
        """Batching ``target``: the answer counts for its target, and its group's slot frees
        with the group's last answer."""
        self.target_versions[target].append(first)
        group = self.group_of.pop(tid)
        self.group_left[group] -= 1
        if not self.group_left[group]:
            del self.group_left[group]
            self.groups_running -= 1

    def _generate_record(self, rank: _Rank, kind: str) -> None:
        """One ``Generate`` effect per busy period of a rank (from its first running
        sequence to its last): what the timeline and the summary count as generation."""
        self.sim.log.add(
            {
                "seq": 0,
                "t": self.env._now,
                "kind": kind,
                "pipeline_id": self.pid,
                "effect": "Generate",
                "args": {"dp_rank": rank.index},
                "scope": "rollout",
                "step": None,
                "gpus": list(rank.gpus),
            }
        )
