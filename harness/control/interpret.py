"""The effect-interpreter loops, written once for every runtime.

Control logic yields effects; a runtime supplies what each effect *does* (a handler) and
these loops supply everything else: sending each handler's result back into the
generator, recording ``effect_start`` / ``effect_end`` around a logged effect, and the
two ways a run may stop a generator early (:data:`HALT`, :class:`Refused`).

A handler may return a value (the effect completed at once) or a generator, which the
loop runs with ``yield from``. The simulator's handlers are generators that yield simpy
events, so the simulator runs these loops inside its processes; the gates' handlers
block on real calls and never yield, so a gate runs a loop to its end with
:func:`run_blocking`. Nothing here reads a clock or does I/O: ``now`` and ``add`` (the
event-log append) are the runtime's.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import GeneratorType
from typing import Any, Callable, Dict, Generator, Iterator, List, Optional, Tuple

from harness.control.effects import effect_fields


class _Halt:
    """A handler's result that ends the generator it answers (a fault-injection hook of
    a runtime: "the pipeline stops here"); the generator is closed, nothing after runs."""

    def __repr__(self) -> str:
        return "HALT"


HALT = _Halt()


@dataclass(frozen=True)
class Refused:
    """A handler's result for an effect that did not happen, and why. It is logged as
    the ``effect_end``'s ``error`` and sent back to the control logic, which decides what
    follows (a resize whose coordinator is gone stops: see ``resize.shrink_order``)."""

    error: str


def interpret(gen: Generator, handle: Callable[[Any], Any]) -> Generator:
    """Run ``gen``: each effect goes to ``handle``; its result is sent back. Nothing is
    logged here (run-level effects: the pipeline lifecycle, the scheduler cycle)."""
    result: Any = None
    send = gen.send
    while True:
        try:
            effect = send(result)
        except StopIteration:
            return
        result = handle(effect)
        if type(result) is GeneratorType:
            result = yield from result
        if result is HALT:
            gen.close()
            return


#: How a runtime handles one effect class: (effect name, bound handler, whether the
#: handler is a generator function, gpus(effect) -> the GPUs it runs on, or None).
Handling = Tuple[str, Callable[[Any], Any], bool, Optional[Callable[[Any], Optional[List[int]]]]]


def drive(gen: Generator, handling_of: Callable[[type], Handling], add: Callable[[Dict[str, Any]], Any],
          now: Callable[[], float], pipeline_id: str, scope: str, step: Optional[int], cycle: Optional[int] = None,
          guard: Optional[Callable[[], None]] = None) -> Generator:
    """Run a control generator, logging each effect's start and end (what the invariants
    read). Records: ``{seq, t, kind, pipeline_id, effect, args, scope, step[, cycle][, gpus]}``
    plus ``result`` (a value) or, for a :class:`Refused` effect, ``error`` after ``args``.
    ``guard`` (optional) runs before each effect and may raise to abort the run."""
    send = gen.send
    result: Any = None
    failed: Optional[Exception] = None
    while True:
        if guard is not None:
            guard()
        try:
            effect = send(result) if failed is None else gen.throw(failed)
        except StopIteration:
            return
        failed = None
        name, handler, takes_time, gpus_of = handling_of(type(effect))
        args = effect_fields(effect)
        start: Dict[str, Any] = {"seq": 0, "t": now(), "kind": "effect_start", "pipeline_id": pipeline_id,
                                 "effect": name, "args": args, "scope": scope, "step": step}
        if cycle is not None:
            start["cycle"] = cycle
        gpus = gpus_of(effect) if gpus_of is not None else None
        if gpus:
            start["gpus"] = gpus
        add(start)
        try:
            if takes_time:
                result = yield from handler(effect)
            else:
                result = handler(effect)
        except Exception as exc:
            # The failure is the control generator's to see, as a raised call is in real
            # code: one that cleans up (RLix's MILES release-after-offload) yields its
            # clean-up effects, which are driven and logged like any other; one that does
            # not re-raises at once, as if it had not been thrown in.
            failed, result = exc, None
            continue
        if type(result) is Refused:
            end: Dict[str, Any] = {"seq": 0, "t": now(), "kind": "effect_end", "pipeline_id": pipeline_id,
                                   "effect": name, "args": args, "error": result.error, "scope": scope, "step": step}
            if cycle is not None:
                end["cycle"] = cycle
            if gpus:
                end["gpus"] = gpus
            add(end)
            continue
        end = start.copy()  # same keys in the same order; "seq"/"t"/"kind" values replaced
        end["t"] = now()
        end["kind"] = "effect_end"
        if result is not None:
            end["result"] = list(result) if isinstance(result, (list, tuple)) else result
        add(end)


def run_blocking(loop: Iterator[Any]) -> None:
    """Run an interpreter loop whose handlers all block (a gate's): none may yield."""
    for item in loop:
        raise RuntimeError(f"a blocking runtime's handler yielded {item!r}: it must complete before returning")
