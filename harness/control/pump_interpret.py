"""The single controller's pump-resume loop, written once for the simulator and the real
CPU runtime.

``train_pump`` / ``rollout_pump`` are generators; something must resume them with each
effect's result, log the effect's ``effect_start`` / ``effect_end``, park a blocking
effect (admission, capacity, in-flight, permit, selection) until the controller state
changes, apply the instant bookkeeping effects and hand the ones that take time to the
runtime. That loop is :meth:`PumpInterpreter.drive`. Both runtimes use it:

* ``simulators/pipelines/single_controller.py`` runs it inside simpy processes (``yield from``):
  its handlers are generators yielding simpy events, and the "state changed" wait is a
  simpy event;
* ``gpu_gates/streaming/runtime.py`` runs it under asyncio through :func:`run_awaiting`:
  its handlers are coroutines and the wait is ``asyncio.Event.wait()``.

The loop itself never reads a clock (``now`` is the runtime's), never sleeps and does no
I/O: whatever must wait is *yielded* to the runtime that drives it. What a runtime
supplies (``runtime``):

* ``_<EffectName>(effect)`` for every effect that takes time: a value, a generator (run
  with ``yield from``) or an awaitable (yielded; the driver sends back its result);
* optionally ``_after_<EffectName>(effect, result)`` after an instant effect (e.g. stop
  the generations of the groups ``AbortStaleInflight`` dropped, clear the data plane's
  samples of the groups ``ClearSamples`` names);
* ``notify()``, called once after an effect that changed the controller state, to wake
  every parked blocking effect; ``change()``, the thing to yield to wait for that wake-up.
"""

from __future__ import annotations

from types import GeneratorType
from typing import Any, Callable, Dict, Generator, List, Optional

from harness.control.effects import effect_fields
from harness.streaming.apply import FINISHED, NOT_INSTANT, apply_instant, is_blocking, next_effect, try_blocking


class PumpInterpreter:
    """Resumes pump generators against one :class:`~harness.streaming.controller.ControllerState`.

    ``add`` appends a record built whole (``EventLog.add``); ``gpus_of(effect)`` (optional)
    names the GPUs an effect runs on (the simulator's placement; logged as ``gpus``)."""

    def __init__(self, runtime: Any, state: Any, pipeline_id: str, add: Callable[[Dict[str, Any]], Any],
                 now: Callable[[], float], gpus_of: Optional[Callable[[Any], Optional[List[int]]]] = None) -> None:
        self.runtime, self.state, self.pipeline_id = runtime, state, pipeline_id
        self.add, self.now, self.gpus_of = add, now, gpus_of
        self._seen_changes = 0  # the state's change counter when the runtime last notified

    def drive(self, gen: Generator, scope: str, step: Optional[int] = None) -> Generator:
        """Run ``gen`` to its end and return its return value. A blocking effect the
        controller's stop cuts short ends with ``error: "stopped"`` and closes ``gen``
        (the result is then ``None``); once stopped, every pump but the train pump
        (``scope == "step"``) is closed at its next effect (``next_effect``)."""
        runtime, st, add, now, gpus_of = self.runtime, self.state, self.add, self.now, self.gpus_of
        result: Any = None
        while True:
            effect, value = next_effect(gen, result, st, scope)
            if effect is FINISHED:
                return value
            name = type(effect).__name__
            start: Dict[str, Any] = {"seq": 0, "t": now(), "kind": "effect_start", "pipeline_id": self.pipeline_id,
                                     "effect": name, "args": effect_fields(effect), "scope": scope, "step": step}
            gpus = gpus_of(effect) if gpus_of is not None else None
            if gpus:
                start["gpus"] = gpus
            add(start)
            error = None
            if is_blocking(effect):
                result = yield from self._wait(effect)
                if result is None:
                    error = "stopped"
            else:
                result = apply_instant(st, effect)
                if result is not NOT_INSTANT:
                    hook = getattr(runtime, "_after_" + name, None)
                    if hook is not None:
                        hook(effect, result)
                else:
                    result = getattr(runtime, "_" + name)(effect)
                    if type(result) is GeneratorType:
                        result = yield from result
                    elif hasattr(result, "__await__"):
                        result = yield result
            end = start.copy()  # same keys in the same order; "t"/"kind" replaced
            end["t"] = now()
            end["kind"] = "effect_end"
            if result is not None:
                end["result"] = list(result) if isinstance(result, (list, tuple)) else result
            if error:
                end["error"] = error
            add(end)
            if st.changes != self._seen_changes:
                self._seen_changes = st.changes
                runtime.notify()
            if error:
                gen.close()
                return None

    def _wait(self, effect: Any) -> Generator[Any, Any, Any]:
        """Try a blocking effect; until it succeeds, wait for the next state change.
        ``None`` when the controller stopped first."""
        st, change = self.state, self.runtime.change
        while True:
            if st.stopped:
                return None
            got = try_blocking(st, effect)
            if got is not None:
                return got
            yield change()


async def run_awaiting(loop: Generator) -> Any:
    """Drive a loop that yields awaitables (an asyncio runtime's :meth:`PumpInterpreter.drive`):
    await each one and send its result back; an exception it raises (a cancellation
    included) is thrown into the loop at the same point. Returns the loop's value."""
    value: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            item = loop.send(value) if error is None else loop.throw(error)
        except StopIteration as stop:
            return stop.value
        error = None
        try:
            value = await item
        except BaseException as e:  # noqa: BLE001 - re-raised inside the loop
            value, error = None, e
