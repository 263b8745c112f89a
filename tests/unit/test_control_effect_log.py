"""The logged drive of the control logic (harness/control/interpret.py) on real orders: an
effect_start and effect_end record per effect, a refusal logged as the effect's error, the
guard aborting before the next effect, and the blocking and generator interpreters."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

from harness.control import nemo_async
from harness.control.interpret import EffectLog, Refused, interpret, run_blocking
from harness.control.resize import expand_order, shrink_order
from tests.unit.control_script import Injected, Script, nemo_ctx, promoted


# ---------------------------------------------------------------------------- the logged loop
def test_drive_records_start_and_end_of_every_effect_and_a_refusal_as_error():
    ctx = promoted(nemo_ctx())
    records: List[Dict[str, Any]] = []
    clock = iter(range(100))
    script = Script(ctx, answers={"LockCoordinator": Refused("gone")})

    def gpus_of(e):
        return [9] if hasattr(e, "ranks") else None

    run_blocking(
        shrink_order(ctx, [0]),
        script,
        log=EffectLog(records.append, lambda: float(next(clock)), "p", "shrink", None, 3, gpus_of),
    )
    assert records == [
        {
            "seq": 0,
            "t": 0.0,
            "kind": "effect_start",
            "pipeline_id": "p",
            "effect": "LockCoordinator",
            "args": {"purpose": "shrink"},
            "scope": "shrink",
            "step": None,
            "cycle": 3,
        },
        {
            "seq": 0,
            "t": 1.0,
            "kind": "effect_end",
            "pipeline_id": "p",
            "effect": "LockCoordinator",
            "args": {"purpose": "shrink"},
            "error": "gone",
            "scope": "shrink",
            "step": None,
            "cycle": 3,
        },
    ]
    records.clear()
    script.answers.clear()
    run_blocking(nemo_async.train_step(ctx, 0), script, log=EffectLog(records.append, lambda: 0.0, "p", "step", 0))
    starts = [r["effect"] for r in records if r["kind"] == "effect_start"]
    ends = [r["effect"] for r in records if r["kind"] == "effect_end"]
    assert starts == ends == [n for n in script.seen[1:]]
    publish_end = next(r for r in records if r["kind"] == "effect_end" and r["effect"] == "PublishVersion")
    assert publish_end["result"] == 1 and "cycle" not in publish_end


def test_drive_guard_aborts_before_the_next_effect():
    ctx = promoted(nemo_ctx())
    script = Script(ctx)
    calls = []

    def guard():
        calls.append(1)
        if len(calls) > 2:
            raise Injected("aborted")

    with pytest.raises(Injected):
        run_blocking(
            expand_order(ctx, [0]), script, log=EffectLog(lambda r: None, lambda: 0.0, "p", "expand"), guard=guard
        )
    assert script.seen == ["LockCoordinator", "MarkInactive"]


def test_run_blocking_refuses_a_handler_that_yields():
    def waits(effect):
        yield "an event"

    with pytest.raises(RuntimeError, match="must complete"):
        run_blocking(nemo_async.initialize(nemo_ctx()), waits)


def test_interpret_runs_generator_handlers_with_yield_from():
    ctx = nemo_ctx()

    def handler(effect):
        yield ("wait", type(effect).__name__)
        return None

    waited = list(interpret(nemo_async.initialize(ctx), handler))
    assert [w[1] for w in waited][:3] == ["RequestGpus", "ReloadTrainComm", "BuildCache"]
