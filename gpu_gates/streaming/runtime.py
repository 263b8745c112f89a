"""The single controller in real time: the harness's pumps interpreted with asyncio, a
real torch trainer (:mod:`gpu_gates.streaming.split_trainer`) and a fake generator with long-tailed
latency.

The same control logic as the simulator's ``single_controller`` pipeline
(``harness.control.train_pump`` / ``rollout_pump``), and the same bookkeeping
(``harness.streaming.apply``); here an effect takes the time it really takes:

* ``Generate`` sleeps a per-(prompt, attempt) log-normal latency (the long tail) and can
  be cut short by the train pump's abort; the group's data (tokens, masks, rewards) is
  drawn from the prompt id, so a run is reproducible apart from timing;
* log-probs, ``train_microbatch`` and ``finish_train_step`` run the torch model in a
  worker thread (``asyncio.to_thread``, as NeMo's single controller does), so the event
  loop keeps generating while the trainer works — the overlap :func:`overlap_s` measures;
* ``SyncWeights`` copies the trainer's parameters into the generator's copy.

Like NeMo's actor, the first pump to finish decides: when the train pump is done the
rollout pump, in-flight rollouts and the watchdog are cancelled. Records follow the
harness schema, so ``harness.logs.invariants.check_log`` reads the log as it reads a
simulator log.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from harness.control import rollout_pump, train_pump
from harness.control.interpret import run_awaiting
from harness.logs.writer import EventLog, header_record
from harness.streaming import checkpoint
from harness.streaming.apply import PumpHandlers
from harness.streaming.controller import ControllerState, StreamingConfig, setup_fields
from gpu_gates.streaming.split_trainer import Batch, SplitTrainer, make_batch


@dataclass(frozen=True)
class GeneratorSpec:
    seed: int = 0
    median_s: float = 0.02  # median rollout latency of a group
    sigma: float = 1.0  # log-space sigma: the long tail
    max_s: float = 0.5
    sequence_length: int = 12
    infra_failure_rate: float = 0.0
    data_failure_rate: float = 0.0


class FakeGenerator:
    """Rollouts with long-tailed latency; holds the weights it generates with."""

    def __init__(self, spec: GeneratorSpec, generations_per_prompt: int) -> None:
        self.spec = spec
        self.generations = generations_per_prompt
        self.weights: Dict[str, torch.Tensor] = {}
        self.version = 0

    def draw(self, prompt_id: int, attempt: int) -> Tuple[float, str]:
        s = self.spec
        rng = np.random.default_rng([s.seed, prompt_id, attempt])
        latency = float(min(s.max_s, s.median_s * np.exp(s.sigma * rng.standard_normal())))
        u = float(rng.random())
        outcome = (
            "infra" if u < s.infra_failure_rate else "data" if u < s.infra_failure_rate + s.data_failure_rate else "ok"
        )
        return latency, outcome

    def group(self, prompt_id: int) -> Batch:
        """The group's sequences; advantages are group-normalized rewards (GRPO)."""
        batch = make_batch(
            self.spec.seed * 100_003 + prompt_id, self.generations, self.spec.sequence_length, min_valid=1
        )
        rewards = batch.advantages
        batch.advantages = rewards - rewards.mean()
        return batch

    def load(self, named: Dict[str, torch.Tensor], version: int) -> None:
        self.weights = {k: v.detach().clone() for k, v in named.items()}
        self.version = version


class StreamingRuntime:
    def __init__(
        self,
        cfg: StreamingConfig,
        steps: int,
        trainer: SplitTrainer,
        generator: FakeGenerator,
        pipeline_id: str = "sc",
        log: Optional[EventLog] = None,
        lost_finish_at: Optional[int] = None,
        checkpoint_after: Optional[int] = None,
    ) -> None:
        self.cfg, self.steps, self.trainer, self.gen = cfg, steps, trainer, generator
        self.pid = pipeline_id
        self.state = ControllerState(cfg)
        self.log = log or EventLog(header_record({"nodes": 1, "gpus_per_node": 0}, source="cpu:streaming_runtime"))
        self.lost_finish_at = lost_finish_at
        self.checkpoint_after = checkpoint_after  # steps after which the buffer is checkpointed and the run resumed
        self._pumps: List[asyncio.Task] = []
        self._retired: set = set()  # the pumps of the state a restore replaced
        self._t0 = 0.0
        self._changed: Optional[asyncio.Event] = None
        self.pumps = PumpHandlers(self, self.state, self.pid, self.log.add, self.now)
        self._aborts: Dict[int, asyncio.Event] = {}
        self._data: Dict[int, Batch] = {}  # group id -> its sequences, from commit until trained or dropped
        self._tasks: List[asyncio.Task] = []
        self._fatal: Optional[asyncio.Future] = (
            None  # a rollout's error: ends the run (NeMo: it propagates through run())
        )
        self._last_progress = 0.0
        self.steps_done = 0

    # ------------------------------------------------------------------ run
    def now(self) -> float:
        return round(time.monotonic() - self._t0, 6)

    def emit(self, kind: str, **fields: Any) -> None:
        self.log.emit(kind, self.now(), **fields)

    async def run(self, timeout_s: float = 60.0) -> str:
        """Run the pumps until the train pump is done; returns done | failed: ... | timeout."""
        self._t0 = time.monotonic()
        self._changed = asyncio.Event()
        self._fatal = asyncio.get_running_loop().create_future()
        cfg = self.cfg
        self.emit("streaming_setup", pipeline_id=self.pid, **setup_fields(cfg))
        self.gen.load(dict(self.trainer.model.named_parameters()), self.trainer.version)
        train = asyncio.ensure_future(self._train())
        self._start_pumps()
        reason = "done"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while True:  # a pump retired by a restore ending is not the run ending
                done, _ = await asyncio.wait(
                    [train, *self._pumps, self._fatal],
                    timeout=max(0.0, deadline - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                done = {d for d in done if d not in self._retired}
                if done or loop.time() >= deadline:
                    break
            if not done:
                reason = "timeout"
            else:
                first = done.pop()
                exc = first.exception()
                if exc is not None:
                    reason = f"failed: {exc}"
                elif first is not train:
                    reason = f"failed: a pump ended first ({first.result()})"
        finally:  # cancel every sibling: the train pump, the pumps and the rollouts in flight
            self.state.stopped = True
            for ev in self._aborts.values():
                ev.set()
            for t in [train, *self._tasks]:
                if not t.done():
                    t.cancel()
            await asyncio.gather(train, *self._tasks, return_exceptions=True)
            if not self._fatal.done():
                self._fatal.cancel()
        self.emit(
            "sim_end", reason=reason.split(":")[0], sim_time=self.now(), events=len(self.log.records), detail=reason
        )
        return reason

    def _start_pumps(self, top_up: bool = False) -> None:
        self._pumps = [
            asyncio.ensure_future(self.drive(rollout_pump.run(self.cfg, self.state.next_prompt, top_up), "rollout")),
            asyncio.ensure_future(self.drive(rollout_pump.stall_watchdog(self.cfg), "watchdog")),
        ]
        self._tasks.extend(self._pumps)

    async def _train(self) -> None:
        k = self.checkpoint_after
        for step, gen in train_pump.steps(self.cfg, k or self.steps):
            await self.drive(gen, "step", step)
            self.steps_done += 1
        if k:
            await self._checkpoint_and_restore()
            for step, gen in train_pump.steps(self.cfg, self.steps, start=k):
                await self.drive(gen, "step", step)
                self.steps_done += 1

    async def _checkpoint_and_restore(self) -> None:
        """Save the buffer, lose the process (every pump and rollout of this state is
        cancelled, in-flight generations with it) and go on from a state restored from
        the save, its pumps restarted with top-up (harness/streaming/checkpoint.py)."""
        snap = checkpoint.snapshot(self.state)
        lost = [e.group_id for e in self.state.buffer.inflight()]
        self.emit(
            "buffer_checkpoint",
            pipeline_id=self.pid,
            step=self.state.trainer_version,
            groups=[g["group_id"] for g in snap["groups"]],
            reserve=len(snap["reserve"]),
            lost_inflight=lost,
        )
        self.state.stopped = True
        for ev in self._aborts.values():
            ev.set()
        old = [t for t in self._tasks if not t.done()]
        self._retired.update(self._tasks)
        for t in old:
            t.cancel()
        await asyncio.gather(*old, return_exceptions=True)
        self._tasks = []
        self.state = checkpoint.restore(self.cfg, snap)
        self.pumps = PumpHandlers(self, self.state, self.pid, self.log.add, self.now)
        self.emit(
            "buffer_restore",
            pipeline_id=self.pid,
            step=self.state.trainer_version,
            groups=[e.group_id for e in self.state.buffer.ready()],
            reserve=len(self.state.spares),
        )
        self._start_pumps(top_up=True)

    # ------------------------------------------------------------------ the interpreter
    async def drive(self, gen, scope: str, step: Optional[int] = None) -> Any:
        """The interpreter over a pump (``harness.streaming.apply.PumpHandlers``) on this event loop."""
        return await run_awaiting(gen, self.pumps.handle, **self.pumps.options(scope, step))

    def change(self):
        """What a parked blocking effect awaits: the next state change (see ``notify``)."""
        return self._changed.wait()

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _after_AbortStaleInflight(self, _effect, group_ids) -> None:
        """The state dropped the groups: stop their generations, forget their data."""
        self._forget(group_ids)

    def _after_Evict(self, _effect, group_ids) -> None:
        self._forget(group_ids)

    def _forget(self, group_ids) -> None:
        for gid in group_ids:
            if gid in self._aborts:
                self._aborts[gid].set()
            self._data.pop(gid, None)

    # ------------------------------------------------------------------ effects that take time
    async def _StartRollout(self, e):
        gen = rollout_pump.rollout(self.cfg, e.prompt_id, e.batch, e.target_step, e.group_id)
        task = asyncio.ensure_future(self.drive(gen, "rollout"))
        task.add_done_callback(self._rollout_done)
        self._tasks.append(task)

    def _rollout_done(self, task: asyncio.Task) -> None:
        """A rollout that raised (a drop past its budget) is fatal to the run: run() sees
        it and cancels the sibling rollouts, as NeMo RL's failed dispatch task ends its run."""
        if task.cancelled() or task.exception() is None or self._fatal is None or self._fatal.done():
            return
        self._fatal.set_exception(task.exception())

    async def _Generate(self, e):
        latency, outcome = self.gen.draw(e.prompt_id, e.attempt)
        abort = self._aborts[e.group_id] = asyncio.Event()
        try:
            await asyncio.wait_for(abort.wait(), timeout=latency if outcome == "ok" else latency / 2)
            return "aborted"
        except asyncio.TimeoutError:
            # an abort set in the same turn of the loop as the timeout lands here too: the
            # state has already dropped the group, so it must not be committed
            if abort.is_set():
                return "aborted"
        finally:
            self._aborts.pop(e.group_id, None)
        if outcome == "ok":
            self._data[e.group_id] = self.gen.group(e.prompt_id)
            self._last_progress = time.monotonic()
        return outcome

    def _batch(self, groups) -> Batch:
        return Batch.cat(self._data[g] for g in groups)

    async def _ComputeLogProbs(self, e):
        batch = self._batch(e.groups)

        def logprobs():
            with torch.no_grad():
                return self.trainer.model(batch.tokens).float().log_softmax(-1).mean().item()

        await asyncio.to_thread(logprobs)

    async def _ComputeAdvantages(self, e):
        return None  # group-normalized at generation (FakeGenerator.group)

    def _trainer_record(self, action: str, step: Optional[int], **extra: Any) -> None:
        self.emit("trainer_step", pipeline_id=self.pid, action=action, step=step, version=self.trainer.version, **extra)

    async def _BeginTrainStep(self, e):
        await asyncio.to_thread(self.trainer.begin_train_step, e.step)
        self._trainer_record("begin", e.step)

    async def _TrainMicrobatches(self, e):
        mb = self.cfg.microbatch_groups
        for i in range(0, len(e.groups), mb):
            chunk = e.groups[i : i + mb]
            await asyncio.to_thread(self.trainer.train_microbatch, self._batch(chunk))
            self._trainer_record("microbatch", e.step, groups=list(chunk))
        for g in e.groups:
            self._data.pop(g, None)
        self._last_progress = time.monotonic()

    async def _FinishTrainStep(self, e):
        if self.lost_finish_at == e.step:
            self.emit("fault_fired", name="lost_finish", pipeline_id=self.pid, step=e.step)
        else:
            result, metrics = await asyncio.to_thread(self.trainer.finish_train_step)
            self._trainer_record("finish", e.step, applied=result.applied, microbatches=result.microbatches)
        self.state.trainer_version += 1
        self.state.changed()
        return self.state.trainer_version

    async def _AbortTrainStep(self, e):
        had = self.trainer.abort_train_step()
        self._trainer_record("abort", e.step, aborted=had)
        return had

    async def _SyncWeights(self, e):
        self.gen.load(dict(self.trainer.model.named_parameters()), e.version)

    async def _Backoff(self, e):
        await asyncio.sleep(e.seconds)

    async def _WatchdogTick(self, e):
        await asyncio.sleep(e.interval_s)
        return round(time.monotonic() - max(self._last_progress, self._t0), 6)

    async def _StallDetected(self, e):
        self.emit("stall", pipeline_id=self.pid, idle_s=e.idle_s, action=e.action)
        if e.action == "abort":
            raise RuntimeError(f"stall watchdog: no progress for {e.idle_s:g} s")


def intervals(records, effect: str, pid: Optional[str] = None) -> List[Tuple[float, float]]:
    """(start, end) of every completed ``effect`` in a log (matched per pipeline, effect
    and args, in order)."""
    open_: Dict[Any, List[float]] = {}
    out = []
    for r in records:
        if r.get("kind") not in ("effect_start", "effect_end") or r["effect"] != effect:
            continue
        if pid is not None and r["pipeline_id"] != pid:
            continue
        key = (r["pipeline_id"], repr(sorted(r["args"].items())))
        if r["kind"] == "effect_start":
            open_.setdefault(key, []).append(r["t"])
        elif open_.get(key):
            out.append((open_[key].pop(0), r["t"]))
    return out


def overlap_s(a: List[Tuple[float, float]], b: List[Tuple[float, float]]) -> float:
    """Length of time covered by both interval sets."""

    def union(iv):
        merged: List[List[float]] = []
        for s, e in sorted(iv):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        return merged

    total = 0.0
    for s1, e1 in union(a):
        for s2, e2 in union(b):
            total += max(0.0, min(e1, e2) - max(s1, s2))
    return total
