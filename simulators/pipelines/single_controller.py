"""A ``single_controller`` pipeline: NeMo RL's streaming single controller in simulated time.

Interprets the harness's control logic (``harness.control.train_pump`` /
``rollout_pump``) with simpy, the way ``pipeline.py`` interprets ``nemo_async``: every
effect is logged as ``effect_start``/``effect_end``; the bookkeeping of the shared state
is ``harness.streaming.apply`` (the same code the real CPU runtime uses); only time is
modelled here:

* **generation**: a prompt group is ``generations_per_prompt`` trajectories with
  log-normal decode lengths (the workload's long tail); the group is done when its
  longest trajectory is. A trajectory decodes at the per-request rate of a full rank
  (``tokens_per_s_per_rank x c / (c + batching_half_point) / c`` at ``c =
  max_concurrent_per_rank``), and the inference ranks hold at most ``ranks x
  max_concurrent_per_rank / generations_per_prompt`` groups at once. Lengths are drawn
  per (prompt, attempt) from the scenario seed, so two pipelines of one scenario see the
  *same* workload (the streaming vs batch comparison relies on it).
* **training**: log-probs cost ``old_log_probs_s_per_trajectory`` per trajectory, one
  ``train_microbatch`` costs ``streaming.train_s_per_microbatch`` plus
  ``train_s_per_trajectory`` per trajectory (divided over the trainer GPUs), the finish
  (optimizer step) costs ``train_fixed_s``; the trainer is the harness's split-step state
  machine, which writes ``trainer_step`` records for what it did.
* **weight sync**: the weights cross from the trainer to the inference GPUs at the link
  bandwidth between them (inter-node if they span nodes), plus ``finalize_s``.

NeMo's single controller owns its (non-colocated) GPUs for the whole run and is not an
RLix pipeline, so this pipeline does not register with the scheduler model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

import numpy as np

from harness.control import rollout_pump, train_pump
from harness.control import streaming_effects as fx
from harness.streaming import checkpoint
from harness.streaming.apply import PumpHandlers
from harness.streaming.controller import ControllerState, StreamingConfig, setup_fields
from harness.streaming.split_step import SplitApiError, SplitStepMachine
from simulators.runtime.cluster import OutOfMemory
from simulators.pipelines.dataplane import ROLLOUT_FIELDS, WRITEBACK_FIELDS, DataPlaneSim
from simulators.costmodel.formulas import cap_quantile
from simulators.runtime.env import Link
from simulators.runtime.simulation import SimFailure, Simulation
from simulators.scenario.spec import PipelineSpec

_WORKLOAD_STREAM = 0x5C  # seed-sequence tag of the per-prompt decode lengths


def streaming_config(spec: PipelineSpec) -> StreamingConfig:
    s, w = spec.streaming, spec.workload
    return StreamingConfig(
        groups_per_step=w.prompts_per_step,
        generations_per_prompt=w.generations_per_prompt,
        sampler=s.sampler,
        window=s.window,
        freshest_first=bool(s.freshest_first),
        custom_target=s.custom_target,
        min_groups_for_streaming_train=s.min_groups_for_streaming_train,
        max_inflight_prompts=s.max_inflight_prompts,
        max_buffered_rollouts=s.max_buffered_rollouts,
        microbatch_groups=s.microbatch_groups,
        max_infra_attempts_per_prompt=s.max_infra_attempts_per_prompt,
        max_data_attempts_per_prompt=s.max_data_attempts_per_prompt,
        watchdog_interval_s=s.watchdog_interval_s,
        stall_timeout_s=s.stall_timeout_s,
        stall_action=s.stall_action,
        drop_budgets=s.drop_budgets,
        max_skipped_prompts=s.max_skipped_prompts,
        max_consecutive_dropped_prompts=s.max_consecutive_dropped_prompts,
        min_step_batch_fraction=s.min_step_batch_fraction,
        on_dropped_prompt=s.on_dropped_prompt,
        max_replacement_attempts=s.max_replacement_attempts,
        replacement_reserve_prompts=s.replacement_reserve_prompts,
    )


def hold_own_gpus(sim: Simulation, pid: str, c, spec: PipelineSpec, train_gpus, rank_gpus) -> None:
    """A pipeline that owns its GPUs for the run (no scheduler) loads everything once: on
    each training GPU a CUDA context and its share of the training state; on each
    generation GPU a context, its rank's weight shard and the KV cache's share of the GPU."""
    vram = sim.cluster.vram
    weights = spec.model.weight_bytes
    for g in train_gpus:
        vram.alloc(g, f"{pid}/ctx", "cuda_context", c.cuda_context_bytes)
        vram.alloc(g, f"{pid}/train", "train_state", int(weights * c.train_state_multiplier / len(train_gpus)))
    per_gpu = weights // spec.infer_tp
    kv = max(0, int(c.kv_cache_fraction * vram.capacity) - per_gpu - c.cuda_context_bytes)
    for r, gpus in enumerate(rank_gpus):
        for g in gpus:
            vram.alloc(g, f"{pid}/ctx", "cuda_context", c.cuda_context_bytes)
            vram.alloc(g, f"{pid}/dp{r}", "weights", per_gpu)
            vram.alloc(g, f"{pid}/dp{r}", "kv_cache", kv)


def weight_sync_s(cl, spec: PipelineSpec, c, train_gpus, rank_gpus) -> float:
    """A non-colocated weight sync: the whole weights from the trainer to the generation
    GPUs over the slowest link between them (the NICs when they span nodes), plus the
    receivers' ``finalize_s``."""
    spans = {cl.node_of(g) for g in train_gpus} | {cl.node_of(g) for gs in rank_gpus for g in gs}
    bw = cl.spec.inter_node_bytes_per_s if len(spans) > 1 else cl.spec.intra_node_bytes_per_s
    return spec.model.weight_bytes / bw + c.finalize_s


class SingleControllerSim:
    def __init__(self, sim: Simulation, spec: PipelineSpec, index: int) -> None:
        self.sim, self.spec, self.index = sim, spec, index
        self.env = sim.env
        self.pid = spec.name
        self.costs = spec.costs or sim.scenario.costs
        faults = {f.name: f.at_step for f in sim.scenario.faults if f.pipeline == spec.name}
        self.cfg = dataclasses.replace(
            streaming_config(spec),
            warmup_no_wake_step=faults.get("critic_warmup_no_wake"),
            refit_without_pause_step=faults.get("refit_without_pause"),
        )
        self.state = ControllerState(self.cfg)
        self.trainer = SplitStepMachine()
        self.train_gpus = tuple(sorted(spec.train_gpus))
        infer = sorted(spec.infer_gpus)
        tp = spec.infer_tp
        self.rank_gpus = [tuple(infer[r * tp : (r + 1) * tp]) for r in range(len(infer) // tp)]
        self.rank_load = [0] * len(self.rank_gpus)
        w = spec.workload
        c = w.max_concurrent_per_rank
        self.per_request_tokens_s = w.tokens_per_s_per_rank * c / (c + w.batching_half_point) / c
        self.slots = Link(self.env, max(1, len(self.rank_gpus) * c // w.generations_per_prompt))
        self.faults = {f.name: f.at_step for f in sim.scenario.faults if f.pipeline == self.pid}
        self.state.stale_select_target = "stale_select_target" in self.faults
        self.steps_done = 0
        self.finished = False
        self.step = 0
        self._changed = self.env.event()
        env = self.env
        self.pumps = PumpHandlers(self, self.state, self.pid, sim.log.add, lambda: env._now, self._gpus_of)
        self._ages: Dict[int, int] = {}  # staleness (versions) -> trajectories trained in the open step
        self._gen_rank: Dict[int, int] = {}  # group id -> rank generating it
        self._aborts: Dict[int, Any] = {}  # group id -> event fired when the train pump aborts it
        self._last_progress = 0.0
        self._seed = sim.scenario.seed
        self.dataplane = None if spec.data_plane is None else DataPlaneSim(self, spec.data_plane, lambda: self.step)
        self._samples: Dict[int, List[str]] = {}  # group id -> its sample ids in the store

    # ------------------------------------------------------------------ processes
    def main(self):
        sim, env = self.sim, self.env
        try:
            if self.spec.start_s > 0:
                yield env.timeout(self.spec.start_s)
            self._setup()
            self._start_pumps()
            resume_at = self.spec.streaming.checkpoint_restore_after_steps
            for step, gen in train_pump.steps(self.cfg, resume_at or self.spec.steps):
                self.step = step
                yield from self.drive(gen, "step", step)
                self.steps_done += 1
            if resume_at and not self.finished:
                self._checkpoint_and_restore()
                for step, gen in train_pump.steps(self.cfg, self.spec.steps, start=resume_at):
                    self.step = step
                    yield from self.drive(gen, "step", step)
                    self.steps_done += 1
        except (SimFailure, OutOfMemory, SplitApiError, RuntimeError) as e:
            sim.fail(f"{self.pid}: {e}")
            if isinstance(e, OutOfMemory):
                sim.emit(
                    "oom", gpu=e.gpu, owner=e.owner, mem=e.mem, requested=e.requested, used=e.used, capacity=e.capacity
                )
        self._stop()

    def _start_pumps(self, top_up: bool = False) -> None:
        env = self.env
        gen = rollout_pump.run(self.cfg, self.state.next_prompt, top_up)
        env.spawn(self.drive(gen, "rollout"), "pipeline", self.index, 1)
        env.spawn(self._watchdog(), "pipeline", self.index, 2)

    def _checkpoint_and_restore(self) -> None:
        """checkpoint_restore_after_steps: save the buffer after the step, lose the
        process (in-flight generations are aborted, their groups leave the store), and
        go on from a state restored from the save, its pumps restarted with top-up."""
        snap = checkpoint.snapshot(self.state)
        self.sim.emit(
            "buffer_checkpoint",
            pipeline_id=self.pid,
            step=self.state.trainer_version,
            groups=[g["group_id"] for g in snap["groups"]],
            reserve=len(snap["reserve"]),
            lost_inflight=[e.group_id for e in self.state.buffer.inflight()],
        )
        self._stop()
        self.finished = False
        self.state = checkpoint.restore(self.cfg, snap)
        self.state.stale_select_target = "stale_select_target" in self.faults
        env = self.env
        self.pumps = PumpHandlers(self, self.state, self.pid, self.sim.log.add, lambda: env._now, self._gpus_of)
        self.sim.emit(
            "buffer_restore",
            pipeline_id=self.pid,
            step=self.state.trainer_version,
            groups=[e.group_id for e in self.state.buffer.ready()],
            reserve=len(self.state.spares),
        )
        self._start_pumps(top_up=True)

    def resize(self, phase, ranks, cycle):  # pragma: no cover - never registered with the scheduler
        raise RuntimeError(f"{self.pid}: a single controller is not resized by the scheduler")

    def _setup(self) -> None:
        self.sim.emit("streaming_setup", pipeline_id=self.pid, **setup_fields(self.cfg))
        hold_own_gpus(self.sim, self.pid, self.costs, self.spec, self.train_gpus, self.rank_gpus)

    def _stop(self) -> None:
        """The train pump is done (or failed): cancel the rest, as NeMo's first finished
        pump does — in-flight generations are aborted and every pump exits."""
        self.finished = True
        self.state.stopped = True
        for ev in list(self._aborts.values()):
            if not ev.triggered:
                ev.succeed()
        self.notify()

    def notify(self) -> None:
        if not self._changed.triggered:
            self._changed.succeed()
        self._changed = self.env.event()

    def _watchdog(self):
        try:
            yield from self.drive(rollout_pump.stall_watchdog(self.cfg), "watchdog")
        except SimFailure as e:
            self.sim.fail(f"{self.pid}: {e}")

    def _spawn_rollout(self, e: fx.StartRollout):
        gen = rollout_pump.rollout(self.cfg, e.prompt_id, e.batch, e.target_step, e.group_id)
        self.env.spawn(self._rollout_proc(gen), "pipeline", self.index, 3, e.prompt_id)

    def _rollout_proc(self, gen):
        try:
            yield from self.drive(gen, "rollout")
        except (SimFailure, RuntimeError) as e:
            self.sim.fail(f"{self.pid} rollout: {e}")

    # ------------------------------------------------------------------ the interpreter
    def drive(self, gen, scope: str, step: Optional[int] = None):
        """The interpreter over a pump (``harness.streaming.apply.PumpHandlers``) in this simpy process."""
        return self.pumps.run(gen, scope, step)

    def change(self):
        """What a parked blocking effect yields: the next state change (see ``notify``)."""
        return self._changed

    def _gpus_of(self, effect) -> Optional[List[int]]:
        if type(effect).__name__ in fx.STREAMING_TRAINER_EFFECTS or isinstance(effect, fx.SyncWeights):
            return list(self.train_gpus)
        if isinstance(effect, fx.Generate):  # the least loaded rank serves the group
            r = min(range(len(self.rank_gpus)), key=lambda i: (self.rank_load[i], i))
            self.rank_load[r] += 1
            self._gen_rank[effect.group_id] = r
            return list(self.rank_gpus[r])
        return None

    # ------------------------------------------------------------------ timed effects
    def _StartRollout(self, e):
        self._spawn_rollout(e)

    def _decode_tokens(self, prompt_id: int, attempt: int) -> List[int]:
        w = self.spec.workload
        rng = np.random.default_rng([self._seed, _WORKLOAD_STREAM, prompt_id, attempt])
        z = rng.standard_normal(w.generations_per_prompt)
        lengths = np.exp(np.log(w.decode_tokens_median) + w.decode_tokens_sigma * z)
        cap_z = cap_quantile(w.decode_tokens_cap_share)
        if cap_z is not None:  # the top share of the draws runs to the cap
            lengths = np.where(z > cap_z, float(w.decode_tokens_max), lengths)
        self._fail_draw = float(rng.random())
        return [int(min(max(1.0, round(x)), w.decode_tokens_max)) for x in lengths.tolist()]

    def _Generate(self, e):
        tokens = self._decode_tokens(e.prompt_id, e.attempt)
        u = self._fail_draw
        s = self.spec.streaming
        outcome = (
            "infra" if u < s.infra_failure_rate else "data" if u < s.infra_failure_rate + s.data_failure_rate else "ok"
        )
        duration = max(tokens) / self.per_request_tokens_s
        if outcome != "ok":
            duration *= 0.5  # a failure surfaces part-way through the rollout
        abort = self._aborts[e.group_id] = self.env.event()
        with self.slots.request() as req:  # a slot on the inference ranks (left if never granted)
            yield self.env.any_of([req, abort])
            if not abort.triggered:
                yield self.env.any_of([self.env.timeout(duration), abort])
        if outcome == "ok" and not abort.triggered and self.dataplane is not None:
            yield from self._put_group(e.group_id, tokens, abort)  # generate_and_push: stored before it commits
        self._aborts.pop(e.group_id, None)
        self.rank_load[self._gen_rank.pop(e.group_id)] -= 1
        if abort.triggered:
            if self.dataplane is not None:  # aborted while its put was landing: the driver drops it
                self._clear_groups([e.group_id])
            return "aborted"
        if outcome == "ok":
            self._last_progress = self.env.now
        return outcome

    def _after_PauseRollouts(self, _e, _result) -> None:
        at = self.cfg.warmup_no_wake_step
        if at is not None and self.step >= at:  # the pump returns after this pause (train_pump.py)
            self.sim.emit("fault_fired", name="critic_warmup_no_wake", pipeline_id=self.pid, step=self.step)

    def _after_AbortStaleInflight(self, e, group_ids) -> None:
        """The state dropped the groups; their generations stop now."""
        for gid in group_ids:
            ev = self._aborts.get(gid)
            if ev is not None and not ev.triggered:
                ev.succeed()

    # ------------------------------------------------------------------ the data plane (simulators/pipelines/dataplane.py)
    def _put_group(self, group_id: int, tokens: List[int], abort):
        ids = self._samples[group_id] = [f"g{group_id}_{i}" for i in range(len(tokens))]
        end = self.dataplane.put(ids, tokens)
        if end > self.env.now:
            yield self.env.any_of([self.env.timeout(end - self.env.now), abort])

    def _ids(self, groups) -> List[str]:
        return [i for g in groups for i in self._samples[g]]

    def _clear_groups(self, groups) -> None:
        ids = [i for g in groups for i in self._samples.pop(g, ())]
        if ids:
            self.dataplane.clear(ids)

    def _after_ClearSamples(self, e, _result) -> None:
        if self.dataplane is not None:
            self._clear_groups(e.groups)

    def _after_Evict(self, _e, gone) -> None:
        if self.dataplane is not None:  # stale groups leave the store as they leave the buffer
            self._clear_groups(gone)

    def _Backoff(self, e):
        yield self.env.timeout(e.seconds)

    def _traj(self, groups) -> int:
        return len(groups) * self.cfg.generations_per_prompt

    def _ComputeLogProbs(self, e):
        dp = self.dataplane
        if dp is not None:  # get_logprobs_presharded: leaders fetch the seed fields
            shards = yield from dp.fetch(self._ids(e.groups), ROLLOUT_FIELDS, dp.spec.bytes_per_token)
        yield self.env.timeout(self.costs.old_log_probs_s_per_trajectory * self._traj(e.groups) / len(self.train_gpus))
        if dp is not None:  # ... and only they write prev_logprobs back
            yield from dp.write_back(shards)

    def _ComputeAdvantages(self, e):
        return None

    def _trainer_record(self, action: str, step: Optional[int], **extra: Any) -> None:
        self.sim.emit(
            "trainer_step", pipeline_id=self.pid, action=action, step=step, version=self.trainer.version, **extra
        )

    def _BeginTrainStep(self, e):
        self.trainer.begin(e.step)
        self._trainer_record("begin", e.step)

    def _TrainMicrobatches(self, e):
        c, mb = self.costs, self.cfg.microbatch_groups
        for g in e.groups:  # age of what is consumed, for the summary's staleness table
            age = self.trainer.version - self.state.buffer.get(g).start_version
            self._ages[age] = self._ages.get(age, 0) + self.cfg.generations_per_prompt
        dp = self.dataplane
        if dp is not None:  # the train fetch: the rollout's fields plus the written-back ones
            yield from dp.fetch(
                self._ids(e.groups),
                ROLLOUT_FIELDS + WRITEBACK_FIELDS,
                dp.spec.bytes_per_token + dp.spec.writeback_bytes_per_token,
            )
        for i in range(0, len(e.groups), mb):
            chunk = e.groups[i : i + mb]
            self.trainer.microbatch()
            yield self.env.timeout(
                self.spec.streaming.train_s_per_microbatch
                + c.train_s_per_trajectory * self._traj(chunk) / len(self.train_gpus)
            )
            self._trainer_record("microbatch", e.step, groups=list(chunk))
        self._last_progress = self.env.now

    def _FinishTrainStep(self, e):
        yield self.env.timeout(self.costs.train_fixed_s)
        if self.faults.get("lost_finish") == e.step:
            self.sim.emit("fault_fired", name="lost_finish", pipeline_id=self.pid, step=e.step)
        else:
            res = self.trainer.finish()
            self._trainer_record("finish", e.step, applied=res.applied, microbatches=res.microbatches)
        self.sim.emit(
            "batch_consumed",
            pipeline_id=self.pid,
            step=e.step,
            trajectories=sum(self._ages.values()),
            staleness={str(k): v for k, v in sorted(self._ages.items())},
        )
        self._ages = {}
        self.state.trainer_version += 1  # the driver ticks once finish returns (NeMo trainer_version += 1)
        self.state.changed()
        return self.state.trainer_version

    def _AbortTrainStep(self, e):
        had = self.trainer.abort()
        self._trainer_record("abort", e.step, aborted=had)
        return had

    def _SyncWeights(self, e):
        at = self.cfg.refit_without_pause_step
        if at is not None and self.step >= at:  # the pump skipped the pause before this refit (train_pump.py)
            self.sim.emit("fault_fired", name="refit_without_pause", pipeline_id=self.pid, step=self.step)
        yield self.env.timeout(weight_sync_s(self.sim.cluster, self.spec, self.costs, self.train_gpus, self.rank_gpus))

    def _WatchdogTick(self, e):
        yield self.env.timeout(e.interval_s)
        return round(self.env.now - self._last_progress, 6)

    def _StallDetected(self, e):
        self.sim.emit("stall", pipeline_id=self.pid, idle_s=e.idle_s, action=e.action)
        if e.action == "abort":
            raise SimFailure(f"stall watchdog: no progress for {e.idle_s:g} s")
