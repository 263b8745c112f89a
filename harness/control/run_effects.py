"""Run-level effects: what the pipeline lifecycle and the scheduler cycle ask a runtime.

Unlike the step and resize effects (``effects.py``), these are not logged as
``effect_start`` / ``effect_end`` records: each already has its own record in the event
log (a scheduler input such as ``register``, a ``cycle`` or ``resize_start`` record), or
none at all (starting the watchdog). They are interpreted by
:func:`harness.control.interpret.interpret` without an ``EffectLog``; :class:`RunControl`
hands a step or resize generator to the runtime, which interprets it with one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, Optional, Tuple

# ---- the pipeline lifecycle (harness.control.lifecycle)


@dataclass(frozen=True)
class Register:
    """Register the pipeline's clusters (device mappings, TP sizes) with the scheduler."""


@dataclass(frozen=True)
class Admit:
    """Admit the registered pipeline (its requests may now be granted)."""


@dataclass(frozen=True)
class StartWorkers:
    """The pipeline's worker processes exist (their CUDA contexts hold memory)."""


@dataclass(frozen=True)
class StartWatchdog:
    """Start the GENERATION re-request watchdog (``harness.control.watchdog``)."""


@dataclass(frozen=True, eq=False)
class RunControl:
    """Interpret a step or resize generator, logged (an ``EffectLog``). Result: None."""

    gen: Generator
    scope: str  # init | step | shrink | expand
    step: Optional[int] = None
    cycle: Optional[int] = None


@dataclass(frozen=True)
class StepDone:
    step: int


@dataclass(frozen=True)
class MarkFinished:
    """The pipeline stops producing demand: no more refills, watchdog requests, reports."""


@dataclass(frozen=True)
class ClearProgress:
    """Drop the pipeline's progress stream; tell the scheduler when none is left."""


@dataclass(frozen=True)
class GenerationHeld:
    """Query: does the scheduler still give this pipeline GENERATION ranks?"""


@dataclass(frozen=True)
class HoldCoordinator:
    """Take the coordinator lock with no deadline: no resize of this pipeline may still be
    running when it unregisters."""


@dataclass(frozen=True)
class Unregister:
    """Unregister from the scheduler: from here on the pipeline's coordinator is gone."""


@dataclass(frozen=True)
class Teardown:
    """The pipeline's processes exit: ranks leave routing, their memory is freed."""


@dataclass(frozen=True)
class FreeCoordinator:
    """Release the lock taken by :class:`HoldCoordinator`."""


@dataclass(frozen=True)
class CoordinatorAlive:
    """Query: has the pipeline not unregistered yet? (a resize for a gone pipeline is a no-op)"""


# ---- the scheduler cycle (harness.control.cycle)


@dataclass(frozen=True)
class PlanCycle:
    """Plan a cycle (``SchedulerModel.plan_cycle``). Result: the plan, or None when the
    scheduler failed fast."""

    reason: str


@dataclass(frozen=True)
class RunResizes:
    """Start every resize of one phase at once, each as its own coordinator call
    (``harness.control.cycle.resize_call``), and return when all have returned.
    Result: True, or False when the run failed meanwhile."""

    phase: str  # shrink | expand
    cycle: int
    calls: Tuple[Tuple[str, Tuple[int, ...]], ...]  # (pipeline_id, dp ranks), in plan order


@dataclass(frozen=True)
class CommitCycle:
    """Commit the executed plan. Result: the signals for waiters, or None when the
    scheduler failed fast on commit."""

    plan: Any


@dataclass(frozen=True)
class SchedulerFailed:
    """The scheduler failed fast (``SchedulerModel.failed``): the run ends."""


@dataclass(frozen=True)
class SignalWaiters:
    signals: Tuple[Any, ...]
