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

from typing import TYPE_CHECKING, Any, Generator, Iterator, Tuple

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

if TYPE_CHECKING:  # the pumps read the config; harness.streaming runs them (no import back)
    from harness.streaming.controller import StreamingConfig


class EmptyStep(RuntimeError):
    """A step that lost every prompt group: the run fails rather than park forever."""


def train_step(cfg: StreamingConfig, step: int) -> Generator[Any, Any, None]:
    trained = 0
    step_open = False
    while True:
        target = yield StepTarget(step)
        remaining = target - trained
        if remaining <= 0:
            break
        yield Evict()
        groups = yield SelectGroups(min(cfg.min_groups_for_streaming_train, remaining), remaining, step, target)
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
    if not step_open:  # every prompt of the step was dropped: no optimizer step on an empty batch
        raise EmptyStep(
            f"step {step}: every prompt group was dropped, nothing to train; an empty step cannot "
            "tick the trainer version, so the next step could never be selected (NeMo RL fails the run)"
        )
    version = yield FinishTrainStep(step)
    if cfg.refit_without_pause_step is None or step < cfg.refit_without_pause_step:
        yield PauseRollouts()  # NeMo RL pauses generation before the refit (NVIDIA-NeMo/RL #3839's fix)
    if cfg.warmup_no_wake_step is not None and step >= cfg.warmup_no_wake_step:
        # NVIDIA-NeMo/RL #3730's review: a critic warm-up step leaves the policy unchanged, so
        # its refit is skipped, and the resume that only the refit path issued with it
        return
    yield AbortStaleInflight(version)
    yield SyncWeights(version)
    yield ResumeRollouts(version)


def steps(cfg: StreamingConfig, count: int, start: int = 0) -> Iterator[Tuple[int, Generator]]:
    """The single controller's step loop, written once: each step in order with its
    :func:`train_step` generator. A runtime drives each one to its end before taking the
    next (the simulator with ``yield from``, the CPU runtime with ``await``), so the loop
    itself is the same in both."""
    for step in range(start, count):  # start > 0: a run resumed from a checkpoint
        yield step, train_step(cfg, step)
