"""Pipeline initialization shared by every pipeline type: load the training weights,
build and promote the base cache (version -1, so the first expand before any training
syncs real weights — the MILES plan forbids the "checkpoint equals base" shortcut), then
offload, destroy the training NCCL groups where the pipeline type does (residency table)
and give ``actor_train`` back."""

from __future__ import annotations

from typing import Generator

from harness.control.context import PipelineContext
from harness.control.effects import (
    BuildCache,
    DestroyTrainComm,
    OffloadTraining,
    PromoteCache,
    ReleaseGpus,
    ReloadTrainComm,
    RequestGpus,
)
from harness.scheduler.types import ACTOR_TRAIN, Priority

BASE_VERSION = -1


def initialize_training(ctx: PipelineContext) -> Generator:
    """The INITIALIZATION phase of ``actor_train``; whether its process groups outlive it
    is the residency table's ``init`` row (NeMo keeps the pp_group alive, debug #24)."""
    init = ctx.residency["init"]
    yield RequestGpus(ACTOR_TRAIN, Priority.INITIALIZATION)
    if "nccl" in init.loads:
        yield ReloadTrainComm()  # the training process groups are created at init
    yield BuildCache(BASE_VERSION)  # the whole training state is loaded for it
    yield PromoteCache(BASE_VERSION)
    yield OffloadTraining()
    if init.destroys_groups:
        yield DestroyTrainComm()
    yield ReleaseGpus(ACTOR_TRAIN)
