"""The effect interpreter: the one loop that runs every control generator of ``harness/control``.

Everything that happens *between* two effects lives here: sending a handler's result back
into the generator, recording ``effect_start`` / ``effect_end`` around a logged effect,
throwing a handler's failure — or a deadline's timeout — into the generator, and the ways
a run stops a generator early (:data:`HALT`, :class:`Halt`, :class:`Refused`, ``guard``).
A runtime (``simulators/``, ``gpu_gates/``) supplies handlers, what each effect *does*,
and nothing else; control logic decides what follows a failure. The pipeline orders, the
scheduler cycle, the selective sync and the single controller's pumps all run through
:func:`interpret`.

A handler returns a value (the effect completed at once), a generator (run with ``yield
from``: the simulator's handlers yield simpy events) or an awaitable (yielded as it is:
an asyncio runtime awaits it and sends its result back). Three ways to run the loop:

* ``yield from interpret(...)`` inside a simpy process (the simulator);
* :func:`run_blocking` for handlers that block on real calls and never yield (the gates);
* :func:`run_awaiting` for handlers that are coroutines (the real CPU streaming runtime).

The rules, in the order the loop applies them to each effect:

1. ``guard()`` (optional) runs before the generator is resumed: it may raise (the run is
   aborted: the error leaves the loop) or answer true (the generator is closed before its
   next effect and the loop returns ``None``; a failure still pending is thrown in first).
2. With an :class:`EffectLog`, an ``effect_start`` record is written.
3. A :class:`Deadline` that has expired throws its error in place of handling the effect;
   it fires once, and never while the generator tears down after an earlier failure.
4. The handler runs. An ``Exception`` it raises is thrown into the generator at the
   effect's ``yield`` (a ``BaseException`` such as a cancellation leaves the loop without
   resuming the generator); the generator's clean-up effects are driven like any other.
5. The result: :class:`Refused` is logged as the ``effect_end``'s ``error`` and sent back;
   :class:`Halt` ends the generator (closed, nothing after it runs; logged with its
   ``error``, if any); any other value is logged as ``result`` and sent back.
6. ``after()`` (optional) runs once the effect is over (a runtime's "state changed" wake-up).

Nothing here reads a clock or does I/O: ``now``, ``add`` (the event-log append) and
``expired`` are the runtime's.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import GeneratorType
from typing import Any, Callable, Dict, Generator, List, Optional

from harness.control.effects import effect_fields


@dataclass(frozen=True)
class Halt:
    """A handler's result that ends the generator it answers: closed, nothing after it
    runs. ``HALT`` is a runtime's fault-injection hook ("the pipeline stops here"); a
    ``Halt(error)`` is an effect cut short (a parked pump effect when the controller
    stops: ``error: "stopped"`` on its ``effect_end``)."""

    error: Optional[str] = None

    def __repr__(self) -> str:
        return "HALT" if self.error is None else f"Halt({self.error!r})"


HALT = Halt()


@dataclass(frozen=True)
class Refused:
    """A handler's result for an effect that did not happen, and why. It is logged as
    the ``effect_end``'s ``error`` and sent back to the control logic, which decides what
    follows (a resize whose coordinator is gone stops: see ``resize.shrink_order``)."""

    error: str


@dataclass(frozen=True)
class EffectLog:
    """Where a logged run records each effect: ``add`` appends a record built whole,
    ``now`` is the runtime's clock, ``gpus_of(effect)`` (optional) the GPUs an effect runs
    on. Records: ``{seq, t, kind, pipeline_id, effect, args, scope, step[, cycle][, gpus]}``
    plus ``result`` (a value) or ``error``."""

    add: Callable[[Dict[str, Any]], Any]
    now: Callable[[], float]
    pipeline_id: str
    scope: str
    step: Optional[int] = None
    cycle: Optional[int] = None
    gpus_of: Optional[Callable[[Any], Optional[List[int]]]] = None


@dataclass(frozen=True)
class Deadline:
    """A deadline over a whole run of the loop: ``expired()`` is the runtime's clock, and
    ``error()`` what is thrown into the generator once it passed (RLix's selective-sync
    timeout: ``selective_sync.sync_deadline``)."""

    expired: Callable[[], bool]
    error: Callable[[], Exception]


def interpret(
    gen: Generator,
    handle: Callable[[Any], Any],
    log: Optional[EffectLog] = None,
    guard: Optional[Callable[[], Any]] = None,
    deadline: Optional[Deadline] = None,
    after: Optional[Callable[[], None]] = None,
) -> Generator:
    """Run ``gen`` to its end (the module's rules); returns its return value (``None``
    when it was halted or closed by ``guard``)."""
    send, throw = gen.send, gen.throw
    result: Any = None
    failed: Optional[Exception] = None
    while True:
        if guard is not None and guard() and failed is None:
            gen.close()
            return None
        try:
            effect = send(result) if failed is None else throw(failed)
        except StopIteration as stop:
            return stop.value
        if failed is not None:
            failed = None
            deadline = None  # tearing down: the deadline has had its say
        start = None if log is None else _start(log, effect)
        try:
            if deadline is not None and deadline.expired():
                exc = deadline.error()
                deadline = None
                raise exc
            result = handle(effect)
            if type(result) is GeneratorType:
                result = yield from result
            elif result is not None and hasattr(result, "__await__"):
                result = yield result
        except Exception as exc:
            # The failure is the control generator's to see, as a raised call is in real
            # code: one that cleans up (RLix's MILES release-after-offload, the selective
            # sync's teardown) yields its clean-up effects, which are driven and logged
            # like any other; one that does not re-raises at once.
            failed, result = exc, None
            continue
        if start is not None:
            _end(log, start, result)
        if after is not None:
            after()
        if type(result) is Halt:
            gen.close()
            return None


def _start(log: EffectLog, effect: Any) -> Dict[str, Any]:
    start: Dict[str, Any] = {
        "seq": 0,
        "t": log.now(),
        "kind": "effect_start",
        "pipeline_id": log.pipeline_id,
        "effect": type(effect).__name__,
        "args": effect_fields(effect),
        "scope": log.scope,
        "step": log.step,
    }
    if log.cycle is not None:
        start["cycle"] = log.cycle
    gpus = log.gpus_of(effect) if log.gpus_of is not None else None
    if gpus:
        start["gpus"] = gpus
    log.add(start)
    return start


def _end(log: EffectLog, start: Dict[str, Any], result: Any) -> None:
    if type(result) is Refused:  # the error where a result would be, before the context
        end: Dict[str, Any] = {
            "seq": 0,
            "t": log.now(),
            "kind": "effect_end",
            "pipeline_id": log.pipeline_id,
            "effect": start["effect"],
            "args": start["args"],
            "error": result.error,
            "scope": log.scope,
            "step": log.step,
        }
        if log.cycle is not None:
            end["cycle"] = log.cycle
        if "gpus" in start:
            end["gpus"] = start["gpus"]
        log.add(end)
        return
    end = start.copy()  # same keys in the same order; "seq"/"t"/"kind" values replaced
    end["t"] = log.now()
    end["kind"] = "effect_end"
    if type(result) is Halt:
        if result.error is not None:
            end["error"] = result.error
    elif result is not None:
        end["result"] = list(result) if isinstance(result, (list, tuple)) else result
    log.add(end)


def run_blocking(gen: Generator, handle: Callable[[Any], Any], **options: Any) -> Any:
    """:func:`interpret` with handlers that block and return (a gate's): none may yield.
    Returns the generator's value."""
    loop = interpret(gen, handle, **options)
    try:
        item = next(loop)
    except StopIteration as stop:
        return stop.value
    loop.close()
    raise RuntimeError(f"a blocking runtime's handler yielded {item!r}: it must complete before returning")


async def run_awaiting(gen: Generator, handle: Callable[[Any], Any], **options: Any) -> Any:
    """:func:`interpret` under asyncio: each awaitable the loop yields (a coroutine
    handler's, or what a parked effect waits on) is awaited and its result sent back; an
    exception it raises (a cancellation included) is raised inside the loop at the same
    point. Returns the generator's value."""
    loop = interpret(gen, handle, **options)
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
