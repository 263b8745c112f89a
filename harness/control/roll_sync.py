"""ROLL-style synchronous pipeline under RLix: the whole GEN cluster shrinks to zero
at every step (``await_release``), then OLD_LOG_PROBS and ACTOR_TRAINING run on the
training GPUs, then ``actor_train`` is released and the next step's GENERATION request
re-expands the inference ranks, which sync from the new cache (docs/modelled-systems.md#rlix-pipeline-steps).
"""

from __future__ import annotations

from typing import Generator

from harness.control.context import PipelineContext
from harness.control.init import initialize_training
from harness.control.effects import (
    AwaitRelease,
    BeginProgressBatch,
    BuildCache,
    Compute,
    DestroyTrainComm,
    EndProgressBatch,
    OffloadTraining,
    PromoteCache,
    ReleaseGpus,
    ReleaseThenRequest,
    RequestGpus,
    WaitBatch,
)
from harness.scheduler.types import ACTOR_TRAIN, GENERATION_CLUSTER, Priority


def initialize(ctx: PipelineContext) -> Generator:
    yield from initialize_training(ctx)


def train_step(ctx: PipelineContext, step: int) -> Generator:
    yield BeginProgressBatch(step)
    yield RequestGpus(GENERATION_CLUSTER, Priority.GENERATION, step, ctx.gen_estimate or ctx.step_target)
    yield WaitBatch(step)
    yield EndProgressBatch(step)
    yield AwaitRelease(step)  # planned shrink-to-zero of the GEN cluster
    yield RequestGpus(ACTOR_TRAIN, Priority.OLD_LOG_PROBS, step)
    # one worker call under ROLL's state_offload_manger: loads the parameters only (and
    # reloads the groups when offload_nccl); with is_offload_states=False (RLix, Phase 12)
    # it neither offloads them nor destroys the groups at its end, so they are still on
    # the GPUs that release_then_request hands back to the idle pool (residency table)
    yield Compute("old_log_probs", step)
    yield ReleaseThenRequest(ACTOR_TRAIN, ACTOR_TRAIN, Priority.ACTOR_TRAINING, step)
    yield Compute("train", step)
    yield BuildCache(step)  # ROLL: version = the step's global_step
    yield PromoteCache(step)  # every rank is asleep: no sync can be reading
    yield OffloadTraining()
    if ctx.residency["offload"].destroys_groups:
        yield DestroyTrainComm()
    yield ReleaseGpus(ACTOR_TRAIN, step)


def run(ctx: PipelineContext) -> Generator:
    yield from initialize(ctx)
    for step in range(ctx.steps):
        ctx.step = step
        yield from train_step(ctx, step)
