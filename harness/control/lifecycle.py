"""A pipeline's whole run, start to finish, written once for every runtime.

    register → admit → start workers [→ GENERATION watchdog] → initialize →
    train_step × steps → finish

and ``finish`` (RLix pipeline shutdown; debug #64-66): stop producing demand, clear the
progress stream (the scheduler stops planning for it), give the GENERATION ranks back
through a planned release if it still holds any, then — holding the coordinator lock, so
no resize of this pipeline is still running — unregister and tear down. A resize that
reaches the pipeline after that finds its coordinator gone (``cycle.resize_call``,
``resize.shrink_order``): RLix's dead-coordinator case, tolerated as a no-op.

The per-step sequences are the pipeline type's (``nemo_async``, ``roll_sync``); a type
that runs NeMo's GENERATION watchdog says so with ``GENERATION_WATCHDOG = True``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Dict, Generator

from harness.control import nemo_async, roll_sync
from harness.control.context import PipelineContext
from harness.control.effects import AwaitRelease
from harness.control.run_effects import (
    Admit,
    ClearProgress,
    FreeCoordinator,
    GenerationHeld,
    HoldCoordinator,
    MarkFinished,
    Register,
    RunControl,
    StartWatchdog,
    StartWorkers,
    StepDone,
    Teardown,
    Unregister,
)

#: pipeline type -> the module defining its ``initialize`` and ``train_step``
PIPELINE_TYPES: Dict[str, ModuleType] = {"nemo_async": nemo_async, "roll_sync": roll_sync}


def pipeline_run(ctx: PipelineContext) -> Generator:
    control = PIPELINE_TYPES[ctx.kind]
    yield Register()
    yield Admit()
    yield StartWorkers()
    if getattr(control, "GENERATION_WATCHDOG", False):
        yield StartWatchdog()
    yield RunControl(control.initialize(ctx), "init", None)
    for step in range(ctx.steps):
        ctx.step = step
        yield RunControl(control.train_step(ctx, step), "step", step)
        yield StepDone(step)
    yield from finish(ctx)


def finish(ctx: PipelineContext) -> Generator:
    yield MarkFinished()
    yield ClearProgress()
    if (yield GenerationHeld()):
        yield AwaitRelease()  # planned shrink of every GENERATION rank it still holds
    yield HoldCoordinator()
    yield Unregister()
    yield Teardown()
    yield FreeCoordinator()
