"""Pipeline initialization shared by every pipeline type: load the training weights,
build and promote the base cache (version -1, so the first expand before any training
syncs real weights — the MILES plan forbids the "checkpoint equals base" shortcut), then
offload, destroy the training NCCL groups and give ``actor_train`` back."""

from __future__ import annotations

from typing import Generator

from harness.control.context import PipelineContext
from harness.control.effects import (
    BuildCache,
    DestroyTrainComm,
    OffloadTraining,
    PromoteCache,
    ReleaseGpus,
    RequestGpus,
)
from harness.scheduler.types import ACTOR_TRAIN, Priority

BASE_VERSION = -1


def initialize_training(ctx: PipelineContext) -> Generator:
    yield RequestGpus(ACTOR_TRAIN, Priority.INITIALIZATION)
    yield BuildCache(BASE_VERSION)
    yield PromoteCache(BASE_VERSION)
    yield OffloadTraining()
    yield DestroyTrainComm()
    yield ReleaseGpus(ACTOR_TRAIN)
