"""The single controller's pumps under the one interpreter (``harness.control.interpret``)
with their handlers (``harness.streaming.apply.PumpHandlers``) alone: no simpy, no torch.
A scripted runtime stands in for the simulator (handlers that are generators, a "state
changed" token it yields) and asyncio for the real CPU runtime (:func:`run_awaiting`).
The controller state and its bookkeeping are the real ones."""

from __future__ import annotations

import asyncio

import pytest

from harness.control import streaming_effects as fx
from harness.control.interpret import run_awaiting
from harness.streaming.apply import PumpHandlers
from harness.streaming.controller import ControllerState, StreamingConfig

CHANGE = "state-changed?"


class Script:
    """A runtime: ``_<Effect>`` handlers, ``change``/``notify``, a log and a clock."""

    def __init__(self, cfg: StreamingConfig = StreamingConfig()) -> None:
        self.state = ControllerState(cfg)
        self.records = []
        self.clock = 0.0
        self.notified = 0
        self.after = []
        self.interp = PumpHandlers(self, self.state, "p", self.records.append, lambda: self.clock)

    def change(self):
        return CHANGE

    def notify(self) -> None:
        self.notified += 1

    def _ComputeAdvantages(self, e):  # a value at once
        return ("adv",) + e.groups

    def _BeginTrainStep(self, e):  # takes time: a generator the loop runs with yield from
        yield ("sleep", 2.0)
        self.clock += 2.0
        return "begun"

    def _after_Evict(self, effect, result):
        self.after.append((type(effect).__name__, result))  # the effect itself is handed over


def run_alone(rt: Script, gen, scope="step", step=None):
    """Run one drive to its end; ("sleep", s) items are answered, CHANGE is not allowed."""
    loop = rt.interp.run(gen, scope, step)
    sent = None
    seen = []
    while True:
        try:
            item = loop.send(sent)
        except StopIteration as stop:
            return stop.value, seen
        seen.append(item)
        assert item != CHANGE, "parked with nothing to wake it"
        sent = None


def test_each_effect_is_logged_around_its_handling_and_the_pump_value_comes_back():
    rt = Script()

    def pump():
        got = yield fx.StepTarget(0)  # instant bookkeeping (the state answers)
        assert got == 4
        adv = yield fx.ComputeAdvantages((3, 5))
        assert adv == ("adv", 3, 5)
        begun = yield fx.BeginTrainStep(0)
        assert begun == "begun"
        return "pump value"

    value, seen = run_alone(rt, pump(), "step", 0)
    assert value == "pump value"
    assert seen == [("sleep", 2.0)]  # what the handler yielded reached the runtime
    kinds = [(r["kind"], r["effect"]) for r in rt.records]
    assert kinds == [
        ("effect_start", "StepTarget"),
        ("effect_end", "StepTarget"),
        ("effect_start", "ComputeAdvantages"),
        ("effect_end", "ComputeAdvantages"),
        ("effect_start", "BeginTrainStep"),
        ("effect_end", "BeginTrainStep"),
    ]
    start, end = rt.records[4], rt.records[5]
    assert list(start) == ["seq", "t", "kind", "pipeline_id", "effect", "args", "scope", "step"]
    assert list(end) == list(start) + ["result"]
    assert (start["t"], end["t"], end["result"], start["args"]) == (0.0, 2.0, "begun", {"step": 0})
    assert rt.records[3]["result"] == ["adv", 3, 5]  # tuples are logged as lists


def test_gpus_of_is_logged_when_the_runtime_places_an_effect():
    rt = Script()
    rt.interp.gpus_of = lambda e: [7] if isinstance(e, fx.ComputeAdvantages) else None

    def pump():
        yield fx.ComputeAdvantages((1,))
        yield fx.StepTarget(0)

    run_alone(rt, pump())
    assert [r.get("gpus") for r in rt.records] == [[7], [7], None, None]


def test_a_blocking_effect_parks_until_a_change_and_the_runtime_is_notified_once_per_change():
    rt = Script(StreamingConfig(max_inflight_prompts=1))
    order = []

    def holder():
        yield fx.AcquireInflight()
        order.append("holder acquired")
        yield fx.ComputeAdvantages(())  # no state change: no notify
        yield fx.ReleaseInflight()
        order.append("holder released")

    def waiter():
        yield fx.AcquireInflight()
        order.append("waiter acquired")

    first = rt.interp.run(holder(), "rollout")
    second = rt.interp.run(waiter(), "rollout")
    # the holder runs until its handler-free effects are done: no yield at all
    with pytest.raises(StopIteration):
        first.send(None)
    assert order == ["holder acquired", "holder released"]
    assert rt.notified == 1  # the release changed the state once
    rt.state.inflight = 1  # someone else holds the slot again: the waiter must park
    assert second.send(None) == CHANGE
    assert second.send(None) == CHANGE  # woken with no capacity yet: tries again, parks again
    rt.state.release_inflight()
    with pytest.raises(StopIteration):
        second.send(None)
    assert order[-1] == "waiter acquired"
    ends = [r for r in rt.records if r["kind"] == "effect_end" and r["effect"] == "AcquireInflight"]
    assert [e.get("result") for e in ends] == [True, True] and not any("error" in e for e in ends)


def test_a_stop_ends_a_parked_effect_with_stopped_and_closes_the_pump():
    rt = Script(StreamingConfig(max_inflight_prompts=0))
    closed = []

    def pump():
        try:
            yield fx.AcquireInflight()
            closed.append("resumed after a stop")  # must never run
        finally:
            closed.append("closed")

    loop = rt.interp.run(pump(), "step")
    assert loop.send(None) == CHANGE
    rt.state.stopped = True
    with pytest.raises(StopIteration) as stop:
        loop.send(None)
    assert stop.value.value is None
    assert closed == ["closed"]
    end = rt.records[-1]
    assert (end["kind"], end["effect"], end["error"]) == ("effect_end", "AcquireInflight", "stopped")
    assert "result" not in end


def test_once_stopped_every_pump_but_the_train_pump_is_closed_at_its_next_effect():
    rt = Script()
    rt.state.stopped = True

    def pump():
        yield fx.StepTarget(0)
        yield fx.StepTarget(1)
        return "ran"

    rollout_value, _ = run_alone(rt, pump(), "rollout")
    assert rollout_value is None and rt.records == []
    step_value, _ = run_alone(rt, pump(), "step")
    assert step_value == "ran" and len(rt.records) == 4


def test_an_instant_effect_hands_itself_and_its_result_to_the_runtime_after_hook():
    rt = Script()

    def pump():
        evicted = yield fx.Evict()
        return evicted

    value, _ = run_alone(rt, pump())
    assert rt.after == [("Evict", value)]


def test_run_awaiting_drives_the_loop_with_coroutine_handlers_under_asyncio():
    class AsyncRuntime:
        def __init__(self) -> None:
            self.state = ControllerState(StreamingConfig(max_inflight_prompts=1))
            self.records = []
            self.event = asyncio.Event()
            self.interp = PumpHandlers(self, self.state, "p", self.records.append, lambda: 0.0)

        def change(self):
            return self.event.wait()

        def notify(self) -> None:
            self.event.set()
            self.event = asyncio.Event()

        async def _ComputeAdvantages(self, e):
            await asyncio.sleep(0)
            return len(e.groups)

    async def main():
        rt = AsyncRuntime()

        def holder():
            yield fx.AcquireInflight()
            n = yield fx.ComputeAdvantages((1, 2, 3))
            yield fx.ReleaseInflight()
            return n

        def waiter():
            got = yield fx.AcquireInflight()
            return got

        w = asyncio.ensure_future(run_awaiting(waiter(), rt.interp.handle, **rt.interp.options("rollout")))
        rt.state.inflight = 1  # the waiter parks on its first try
        await asyncio.sleep(0)
        assert not w.done()
        rt.state.inflight = 0
        h = await run_awaiting(holder(), rt.interp.handle, **rt.interp.options("rollout"))
        assert h == 3
        assert await asyncio.wait_for(w, 1.0) is True
        return rt

    rt = asyncio.run(main())
    assert [r["effect"] for r in rt.records if r["kind"] == "effect_end"][-1] == "AcquireInflight"


def test_run_awaiting_throws_a_cancellation_into_the_loop_and_the_pump_is_not_resumed():
    resumed = []

    class Slow:
        def __init__(self) -> None:
            self.state = ControllerState(StreamingConfig())
            self.records = []
            self.interp = PumpHandlers(self, self.state, "p", self.records.append, lambda: 0.0)

        def change(self):  # pragma: no cover - nothing parks here
            raise AssertionError

        def notify(self) -> None:
            pass

        async def _BeginTrainStep(self, e):
            await asyncio.sleep(60)

    def pump():
        yield fx.BeginTrainStep(0)
        resumed.append(True)

    async def main():
        rt = Slow()
        task = asyncio.ensure_future(run_awaiting(pump(), rt.interp.handle, **rt.interp.options("step", 0)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return rt

    rt = asyncio.run(main())
    assert resumed == []
    assert [r["kind"] for r in rt.records] == ["effect_start"]  # no end for a cancelled effect
