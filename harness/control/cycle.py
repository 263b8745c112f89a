"""The scheduler cycle's execution order, written once: the order T1 < T2 < T3 is about.

    plan → every shrink, all at once → wait for all → every expand, all at once →
    wait for all → commit → signal the waiters

(RLix ``_central_scheduling_loop`` / ``_execute_resize_calls``; docs/modelled-systems.md#rlix-one-scheduling-cycle).
A donor's ranks are therefore asleep before any recipient wakes on them (T1 < T2), and
a waiter learns of its GPUs only after its expand completed (T2 < T3). When the run
fails during a phase, nothing of the next phase starts and nothing is committed.

When a cycle runs (wake-up on input, the 1 s background poll) is the runtime's: it is a
clock. Each resize runs :func:`resize_call`: a coordinator ``resize_infer`` that finds
its pipeline unregistered does nothing (dead coordinator, tolerated as in RLix). Every
runtime interprets a resize call as :func:`run_resize`, which writes its
``resize_start`` / ``resize_end`` records (what ``resize_order`` reads) on every path.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Generator, Optional, Sequence

from harness.control.context import PipelineContext
from harness.control.resize import expand_order, shrink_order
from harness.control.run_effects import (
    CommitCycle,
    CoordinatorAlive,
    PlanCycle,
    RunControl,
    RunResizes,
    SchedulerFailed,
    SignalWaiters,
)

PHASES = ("shrink", "expand")


def execute_cycle(reason: str) -> Generator:
    plan = yield PlanCycle(reason)
    if plan is None:
        yield SchedulerFailed()
        return
    for phase in PHASES:
        calls = plan.shrink_calls if phase == "shrink" else plan.expand_calls
        ranks_of = "dp_ranks_to_remove" if phase == "shrink" else "dp_ranks_to_add"
        resizes = tuple((c.pipeline_id, tuple(getattr(c, ranks_of))) for c in calls)
        if not (yield RunResizes(phase, plan.cycle, resizes)):
            return  # the run failed: no later phase starts, nothing is committed
    signals = yield CommitCycle(plan)
    if signals is None:
        yield SchedulerFailed()
        return
    yield SignalWaiters(tuple(signals))


def resize_call(ctx: PipelineContext, phase: str, ranks: Sequence[int], cycle: int) -> Generator:
    """One coordinator ``resize_infer`` call of a cycle."""
    if not (yield CoordinatorAlive()):
        return  # the pipeline unregistered: its coordinator is gone, nothing to do
    order = shrink_order if phase == "shrink" else expand_order
    yield RunControl(order(ctx, ranks), phase, None, cycle)


def run_resize(
    ctx: PipelineContext,
    phase: str,
    ranks: Sequence[int],
    cycle: int,
    record: Callable[[str, Dict[str, Any]], None],
    on_error: Optional[Callable[[Exception], None]] = None,
    then: Optional[Callable[[], None]] = None,
) -> Generator:
    """One :func:`resize_call` between its ``resize_start`` and ``resize_end`` records
    (``record(kind, fields)`` is the runtime's log append), for the interpreter to run with
    the runtime's run-level handlers. ``on_error`` takes an error of the call (it re-raises
    what it does not handle); ``then`` runs after a call that completed (a runtime's fault
    hook). The end is recorded on every path."""
    fields = {"cycle": cycle, "pipeline_id": ctx.pipeline_id, "phase": phase, "dp_ranks": list(ranks)}
    record("resize_start", fields)
    try:
        yield from resize_call(ctx, phase, ranks, cycle)
        if then is not None:
            then()
    except Exception as exc:
        if on_error is None:
            raise
        on_error(exc)
    finally:
        record("resize_end", dict(fields))
