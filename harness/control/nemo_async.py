"""NeMo RL async GRPO under RLix: the per-step sequence with partial overlap.

Overlap ranks (inference ranks on training GPUs) sleep while training runs; non-overlap
ranks keep generating. After training the pipeline refreshes the ranks still serving
("active refresh", in flight) from the new CPU cache, publishes the version, and only
then releases ``actor_train``; the scheduler later expands the overlap ranks, which
sync from the same cache and publish the same version (docs/modelled-systems.md#rlix-partial-overlap-shrink-expand-and-routing).
"""

from __future__ import annotations

from typing import Generator

from harness.control.context import PipelineContext
from harness.control.init import initialize_training
from harness.control.effects import (
    ActiveRanks,
    BeginProgressBatch,
    BuildCache,
    Compute,
    ContinueGeneration,
    DestroyTrainComm,
    Finalize,
    LockCoordinator,
    OffloadTraining,
    PauseGeneration,
    PromoteCache,
    PublishVersion,
    ReleaseGpus,
    ReloadTrainComm,
    RequestGpus,
    SyncFromCache,
    UnlockCoordinator,
    WaitBatch,
    WaitEnginesOffloaded,
)
from harness.scheduler.types import ACTOR_TRAIN, GENERATION_CLUSTER, Priority

#: NeMo re-requests GENERATION while no rank is active (``harness.control.watchdog``)
GENERATION_WATCHDOG = True


def initialize(ctx: PipelineContext) -> Generator:
    """Init (base cache v=-1, release), then the first GENERATION request (estimate 1 in
    NeMo), which the expand path serves."""
    yield from initialize_training(ctx)
    yield BeginProgressBatch(0)
    yield RequestGpus(GENERATION_CLUSTER, Priority.GENERATION, 0, ctx.gen_estimate or 1)


def train_step(ctx: PipelineContext, step: int) -> Generator:
    yield WaitBatch(step)
    # before_training: ACTOR_TRAINING preempts the GEN ranks on the training GPUs
    yield RequestGpus(ACTOR_TRAIN, Priority.ACTOR_TRAINING, step)
    if ctx.wait_offloaded:  # the engines' release may answer before the driver has the memory back
        yield WaitEnginesOffloaded()
    yield ReloadTrainComm()
    yield Compute("train", step)
    version = step + 1
    if ctx.release_after_offload:
        yield from _after_training_miles(ctx, step, version)
    else:
        yield BuildCache(version)  # while parameters are still on the GPU (debug #34/#35)
        yield from _offload(ctx)
        yield from _refresh_and_publish(version, ctx)
        yield ReleaseGpus(ACTOR_TRAIN, step)  # only after refresh + publish (release_after_publish)
    yield BeginProgressBatch(step + 1)


def _offload(ctx: PipelineContext) -> Generator:
    yield OffloadTraining()
    if ctx.residency["offload"].destroys_groups:
        yield DestroyTrainComm()


def _refresh_and_publish(version: int, ctx: PipelineContext) -> Generator:
    """after_training: active refresh of the ranks still serving, under the coordinator lock.
    The version is published once every receiver applied it (finalize); ``ctx.publish_on_ack``
    (a fault's order, RLinf #1456) publishes on the sync's acknowledgement instead."""
    yield LockCoordinator("active_refresh")
    yield PromoteCache(version)
    ranks = yield ActiveRanks()
    if ranks:
        yield SyncFromCache(tuple(ranks), version, "active")
        if ctx.publish_on_ack:
            yield PublishVersion(version, "active")
        yield from _finalize(tuple(ranks), ctx.finalize_pause)
    if not (ranks and ctx.publish_on_ack):
        yield PublishVersion(version, "active")
    yield UnlockCoordinator("active_refresh")


def _finalize(ranks, finalize_pause: str) -> Generator:
    """Finalize the serving ranks; RLix's MILES model update service pauses their schedulers
    around it (rlops/rlix ``rlix/pipeline/miles_model_update_service.py``): before PR #14
    ``continue_generation`` came after a finalize that returned, so a failed finalize left
    generation paused for good; PR #14 (0302437, in a8460a9) moved it into a ``finally``."""
    if finalize_pause == "none":
        yield Finalize(ranks)
        return
    yield PauseGeneration(ranks)
    if finalize_pause == "continue_after":
        yield Finalize(ranks)
        yield ContinueGeneration(ranks)
        return
    try:
        yield Finalize(ranks)
    except Exception:  # PR #14's finally (not a finally: a generator closed at the run's end must not yield)
        yield ContinueGeneration(ranks)
        raise
    yield ContinueGeneration(ranks)


def _after_training_miles(ctx: PipelineContext, step: int, version: int) -> Generator:
    """RLix's MILES ``_after_training`` (rlops/rlix rlix/pipeline/miles_pipeline.py at 59ecc9a,
    PR #10, and a8460a9, PR #13): the offload runs even when the cache build fails, and once
    it ran the training GPUs are released even when the weight sync after it fails; the
    failure then goes on up. Without a failure the effects are the default order's, so a
    run with no failure logs the same bytes. (An ``except Exception`` rather than a
    ``finally``: a generator closed at the run's end must not yield.)"""
    offloaded = False
    try:
        try:
            yield BuildCache(version)
        except Exception:
            yield from _offload(ctx)
            offloaded = True
            raise
        yield from _offload(ctx)
        offloaded = True
        yield from _refresh_and_publish(version, ctx)
    except Exception:
        if offloaded:
            yield ReleaseGpus(ACTOR_TRAIN, step)
        raise
    yield ReleaseGpus(ACTOR_TRAIN, step)


def run(ctx: PipelineContext) -> Generator:
    yield from initialize(ctx)
    for step in range(ctx.steps):
        ctx.step = step
        yield from train_step(ctx, step)
