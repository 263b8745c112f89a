"""The pipeline's run and finish sequences (harness/control/lifecycle.py), effect by effect:
NeMo's run with its watchdog and ROLL's without, finish with and without generation
ranks, a runtime halt, and a failure anywhere in the run that never unregisters silently."""

from __future__ import annotations

import pytest

from harness.control.interpret import HALT
from harness.control.lifecycle import finish, pipeline_run
from tests.unit.control_script import Injected, Script, nemo_ctx, roll_ctx, run


# ---------------------------------------------------------------------------- run and finish
RUN_HEAD = ["Register", "Admit", "StartWorkers"]


def test_nemo_pipeline_run_order():
    ctx = nemo_ctx(steps=2)
    script = Script(ctx, answers={"GenerationHeld": True})
    seen = run(pipeline_run(ctx), script)
    top = [
        n
        for n in seen
        if n
        in (
            "Register",
            "Admit",
            "StartWorkers",
            "StartWatchdog",
            "RunControl",
            "StepDone",
            "MarkFinished",
            "ClearProgress",
            "GenerationHeld",
            "AwaitRelease",
            "HoldCoordinator",
            "Unregister",
            "Teardown",
            "FreeCoordinator",
        )
    ]
    assert top == RUN_HEAD + [
        "StartWatchdog",
        "RunControl",
        "RunControl",
        "StepDone",
        "RunControl",
        "StepDone",
        "MarkFinished",
        "ClearProgress",
        "GenerationHeld",
        "AwaitRelease",
        "HoldCoordinator",
        "Unregister",
        "Teardown",
        "FreeCoordinator",
    ]
    scopes = [(f["scope"], f["step"]) for n, f in script.trace if n == "RunControl"]
    assert scopes == [("init", None), ("step", 0), ("step", 1)]


def test_roll_pipeline_run_has_no_watchdog():
    ctx = roll_ctx(steps=1)
    seen = run(pipeline_run(ctx), Script(ctx, answers={"GenerationHeld": False}))
    assert "StartWatchdog" not in seen and seen[:3] == RUN_HEAD


def test_finish_order_with_and_without_generation_ranks():
    ctx = nemo_ctx()
    assert run(finish(ctx), Script(ctx, answers={"GenerationHeld": True})) == [
        "MarkFinished",
        "ClearProgress",
        "GenerationHeld",
        "AwaitRelease",
        "HoldCoordinator",
        "Unregister",
        "Teardown",
        "FreeCoordinator",
    ]
    assert run(finish(ctx), Script(ctx, answers={"GenerationHeld": False})) == [
        "MarkFinished",
        "ClearProgress",
        "GenerationHeld",
        "HoldCoordinator",
        "Unregister",
        "Teardown",
        "FreeCoordinator",
    ]


def test_a_runtime_halt_closes_the_generator_and_nothing_after_runs():
    ctx = nemo_ctx()
    seen = run(finish(ctx), Script(ctx, answers={"GenerationHeld": HALT}))
    assert seen == ["MarkFinished", "ClearProgress", "GenerationHeld"]


@pytest.mark.parametrize("fail_at", ["Register", "Admit", "RunControl", "StepDone", "ClearProgress", "AwaitRelease"])
def test_a_failure_in_the_run_never_unregisters_silently(fail_at):
    ctx = nemo_ctx(steps=1)
    script = Script(ctx, answers={"GenerationHeld": True}, fail_at=fail_at)
    with pytest.raises(Injected):
        run(pipeline_run(ctx), script)
    assert "Unregister" not in script.seen and script.seen[-1] == fail_at
