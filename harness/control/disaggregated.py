"""Disaggregated pipelines: training and generation on GPUs of their own, outside RLix's
scheduler (docs/modelled-systems.md#disaggregated-pipelines). Three orders, each from its
reference implementation:

* ``sync`` — NeMo RL's GRPO with generation on its own GPUs (``grpo_train`` with
  ``colocated.enabled: false``): generate the step's batch with the current weights, then
  log-probs, training, and the weight broadcast to the generation GPUs. Nothing overlaps.
* ``one_step_off`` — verl's ``recipe/one_step_off_policy`` (``OneStepOffRayTrainer.fit``):
  the next batch is generated while the current one trains. Per step: wait for batch k,
  sync the weights (after k updates) to the rollout workers, start batch k+1 on them, then
  log-probs and training on batch k. Batch k+1 is one version behind when it trains.
* ``fully_async`` — verl's ``recipe/fully_async_policy`` and NeMo RL's async GRPO: the
  rollouter admits trajectories one at a time while the staleness window allows
  (:func:`may_admit`), the trainer takes each step's batch as it completes
  (:func:`select_batch`), and after each step the weights are synced with one of three
  behaviours of the generation (:data:`WEIGHT_SYNC_MODES`):

  - ``drain``: no new trajectory is started and the sync waits for the running ones to
    finish (verl's ``partial_rollout: False``);
  - ``pause``: the running trajectories are interrupted, the weights synced, and they go
    on with the new weights (verl's ``partial_rollout: True``: a partial rollout);
  - ``in_flight``: generation goes on during the sync, and the running trajectories take
    the new weights where the sync lands (NeMo RL's ``in_flight_weight_updates: true``).

  With ``pause`` and ``in_flight`` a trajectory's tokens span weight versions; its
  staleness is counted from the version it started with (the oldest it used).

  How the trainer's batch is made (:data:`BATCHINGS`): ``completion`` (verl's message
  queue) takes the oldest completed trajectories, whichever they are; ``target`` (NeMo
  RL's replay buffer) generates each prompt group for one training step and trains step k
  on exactly the groups made for it (:func:`may_start_group`, :func:`target_of`).

Only the order and the rules live here (no clock, no I/O); ``simulators/pipelines/disaggregated.py``
interprets the effects in simulated time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator, List, Optional, Sequence, Tuple

from harness.control.effects import Compute, WaitBatch
from harness.control.streaming_effects import SyncWeights

SHAPES = ("sync", "one_step_off", "fully_async")
WEIGHT_SYNC_MODES = ("drain", "pause", "in_flight")
#: how a fully asynchronous trainer's batch is made: the oldest completed trajectories
#: (verl), or the prompt groups generated for its step (NeMo RL)
BATCHINGS = ("completion", "target")


@dataclass(frozen=True)
class StartRollout:
    """Generate the ``batch``-th batch of trajectories on the generation GPUs with the
    weights of ``version``; returns at once (the trainer waits with ``WaitBatch``)."""

    batch: int
    version: int


@dataclass(frozen=True)
class PauseGeneration:
    """Before a weight sync: ``drain`` stops admitting and waits for the running
    trajectories to finish; ``pause`` interrupts them where they are (kept, to go on)."""

    mode: str


@dataclass(frozen=True)
class ResumeGeneration:
    """After a weight sync: admitting (and the interrupted trajectories) go on."""

    version: int


def trajectory_age_bound(shape: str, max_age: int) -> int:
    """The most versions a trained trajectory may lag the trainer, by construction of the
    order: 0 synchronous, 1 one step off, the configured window when fully asynchronous."""
    return {"sync": 0, "one_step_off": 1}.get(shape, max_age)


def sync(steps: int) -> Generator:
    """``(step, generator)`` pairs: each step's effects, in NeMo RL's synchronous order."""
    for step in range(steps):
        yield step, _sync_step(step)


def _sync_step(step: int) -> Generator:
    yield StartRollout(step, step)
    yield WaitBatch(step)
    yield Compute("old_log_probs", step)
    yield Compute("train", step)
    yield SyncWeights(step + 1)


def one_step_off(steps: int) -> Generator:
    """``(step, generator)`` pairs in verl's one-step-off order. The first batch starts
    before step 0 with the initial weights (version 0)."""
    for step in range(steps):
        yield step, _one_step_off_step(step, steps)


def _one_step_off_step(step: int, steps: int) -> Generator:
    if step == 0:
        yield StartRollout(0, 0)
    yield WaitBatch(step)
    yield SyncWeights(step)  # the weights after ``step`` updates (step 0: the initial ones again)
    if step + 1 < steps:
        yield StartRollout(step + 1, step)
    yield Compute("old_log_probs", step)
    yield Compute("train", step)


def fully_async(steps: int, weight_sync: str) -> Generator:
    """``(step, generator)`` pairs of the trainer's side; the rollouter admits by
    :func:`may_admit` on its own."""
    for step in range(steps):
        yield step, _fully_async_step(step, weight_sync)


def _fully_async_step(step: int, weight_sync: str) -> Generator:
    yield WaitBatch(step)
    yield Compute("old_log_probs", step)
    yield Compute("train", step)
    if weight_sync != "in_flight":
        yield PauseGeneration(weight_sync)
    yield SyncWeights(step + 1)
    if weight_sync != "in_flight":
        yield ResumeGeneration(step + 1)


def may_admit(started: int, trainer_version: int, batch: int, max_age: int, total: int) -> bool:
    """The completion rule's rollouter may start one more trajectory: at most
    ``(v + 1 + max_age)`` batches started while the trainer is at version ``v`` (verl's
    ``(1 + staleness_threshold)`` batches per version; NeMo RL's target window is the same
    bound, :func:`may_start_group`), and no more than the run needs."""
    return started < min(total, (trainer_version + 1 + max_age) * batch)


def select_batch(
    completed: Sequence[Tuple[int, int]], trainer_version: int, batch: int, max_age: int
) -> Tuple[Optional[List[int]], List[int]]:
    """The trainer's batch from the completed trajectories ``(trajectory id, version it
    started with)``: ``(taken, dropped)``, ``taken`` None while fewer than ``batch`` are
    usable (the completion rule). Oldest start first (ties by id); a trajectory older than
    ``max_age`` versions is dropped, not trained (as NeMo RL's replay buffer evicts one; its
    target rule leaves none to evict), batch or not, so that the rollouter's window
    (:func:`may_admit`, which counts what was started less what was dropped) starts its
    replacement."""
    usable = sorted((v, t) for t, v in completed if trainer_version - v <= max_age)
    dropped = sorted(t for t, v in completed if trainer_version - v > max_age)
    if len(usable) < batch:
        return None, dropped
    return [t for _, t in usable[:batch]], dropped


#: where NeMo RL's target rule is read from: ``AsyncTrajectoryCollector`` spawns one worker per
#: prompt group under a semaphore of ``num_prompts_per_step * max_trajectory_age_steps`` (held
#: until the group's every answer is back), for the next target that still lacks trajectories
#: among ``_calculate_target_weights`` (from weight version v: v+1 .. v+a; from the initial
#: weights: 0 .. a); ``ReplayBuffer.sample`` returns only trajectories whose target is the
#: trainer's current step, and the trainer waits until all of them are in
TARGET_BATCHING_SOURCE = (
    "NVIDIA-NeMo/RL",
    "nemo_rl/algorithms/async_utils/trajectory_collector.py, replay_buffer.py",
    "aea463dd2dad3c9dd39d92df3a1616647c8ff45a",
)


def target_of(group: int, prompts_per_step: int) -> int:
    """The training step the ``group``-th prompt group started is generated for: the
    collector fills one target's ``prompts_per_step`` groups before the next target's
    (:data:`TARGET_BATCHING_SOURCE`)."""
    return group // prompts_per_step


def may_start_group(
    started: int, running: int, generation_version: int, prompts_per_step: int, max_age: int, total: int
) -> bool:
    """NeMo RL's collector may spawn one more prompt group (``started`` so far, ``running``
    not yet complete): a slot of its semaphore is free (``prompts_per_step x max_age``
    groups, at least one), the group's target is one the generation's weights may make
    (at most ``generation_version + max_age``), and the run needs it. Unlike
    :func:`may_admit`, a slot is held until the group's longest answer is back, and the
    version that gates is the generation's (set when a weight sync lands), not the trainer's."""
    if started >= total or running >= max(1, prompts_per_step * max_age):
        return False
    return target_of(started, prompts_per_step) <= generation_version + max_age
