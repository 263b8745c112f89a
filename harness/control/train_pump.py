"""The single controller's train pump, as control logic (NeMo RL ``_train_pump``,
docs/modelled-systems.md#nemo-rl-streaming-single-controller "Train pump").

Per step: until the step has trained on its target number of groups (the target shrinks
when prompts are dropped): evict -> select -> log-probs -> advantages -> lazy
``begin_train_step`` (only once a group is in hand, so an empty step never opens) ->
``train_microbatch`` over the groups -> ``clear_samples``. Then ``finish_train_step``
(the one optimizer step; the trainer version ticks here and only here), and the weight
sync with rollouts paused: abort in-flight rollouts the sampler can no longer select,
sync, set the new weight version and resume.

With ``min_groups_for_streaming_train == groups_per_step`` the same loop is the
non-streaming controller: the trainer waits for a whole batch before it starts.
"""

from __future__ import annotations

from typing import Generator

from harness.control.streaming_effects import (
    AbortStaleInflight,
    BeginTrainStep,
    ClearSamples,
    ComputeAdvantages,
    ComputeLogProbs,
    Evict,
    FinishTrainStep,
    PauseRollouts,
    ResumeRollouts,
    SelectGroups,
    StepTarget,
    SyncWeights,
    TrainMicrobatches,
)
from harness.streaming.controller import StreamingConfig


def train_step(cfg: StreamingConfig, step: int) -> Generator:
    trained = 0
    step_open = False
    while True:
        target = yield StepTarget(step)
        remaining = target - trained
        if remaining <= 0:
            break
        yield Evict()
        groups = yield SelectGroups(min(cfg.min_groups_for_streaming_train, remaining), remaining)
        if not groups:  # woken because the target shrank: look again
            continue
        groups = tuple(groups)
        yield ComputeLogProbs(groups)
        yield ComputeAdvantages(groups)
        if not step_open:
            yield BeginTrainStep(step)
            step_open = True
        yield TrainMicrobatches(step, groups)
        yield ClearSamples(step, groups)
        trained += len(groups)
    if not step_open:
        return  # every prompt of the step was dropped: nothing to finish, no tick
    version = yield FinishTrainStep(step)
    yield PauseRollouts()
    yield AbortStaleInflight(version)
    yield SyncWeights(version)
    yield ResumeRollouts(version)


def run(cfg: StreamingConfig, steps: int) -> Generator:
    for step in range(steps):
        yield from train_step(cfg, step)
