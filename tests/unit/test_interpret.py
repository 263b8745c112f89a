"""The interpreter's own rules (harness/control/interpret.py), on toy generators: the
guard, the deadline, what is and is not thrown into the generator. The orders that use
them are pinned in test_control_orders.py (and its siblings for the scheduler cycle and
the run), test_selective_sync_order.py and test_pump_interpret.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.control.interpret import Deadline, EffectLog, Halt, run_blocking


@dataclass(frozen=True)
class Step:
    n: int


class Boom(Exception):
    pass


def steps(seen, count=3, catch=False):
    """Yields Step(0..count-1); with ``catch``, a thrown-in failure yields a clean-up step
    and goes on up."""
    for n in range(count):
        try:
            yield Step(n)
            seen.append(f"after {n}")
        except Boom:
            if not catch:
                raise
            yield Step(100 + n)
            seen.append("cleaned up")
            raise


def test_a_true_guard_closes_the_generator_before_its_next_effect():
    seen, handled = [], []
    answers = iter([False, False, True])
    assert run_blocking(steps(seen), lambda e: handled.append(e.n), guard=lambda: next(answers)) is None
    assert handled == [0, 1] and seen == ["after 0"]


def test_a_true_guard_still_lets_a_pending_failure_be_thrown_in():
    # a stopped controller closes its pumps, but a pump effect that failed meanwhile still
    # fails the pump (thrown in, it goes on up), as it did before the stop
    seen, stopped = [], {"now": False}

    def handle(e):
        if e.n == 1:
            stopped["now"] = True  # the run stops while the failing effect runs
            raise Boom("handler")

    with pytest.raises(Boom, match="handler"):
        run_blocking(steps(seen), handle, guard=lambda: stopped["now"])
    assert seen == ["after 0"]


def test_a_failure_is_thrown_in_so_the_generator_cleans_up_and_the_clean_up_is_logged():
    seen, records = [], []

    def handle(e):
        if e.n == 1:
            raise Boom("handler")

    with pytest.raises(Boom):
        run_blocking(steps(seen, catch=True), handle, log=EffectLog(records.append, lambda: 0.0, "p", "step", 0))
    assert seen == ["after 0", "cleaned up"]
    logged = [(r["kind"], r["args"]["n"]) for r in records]
    assert logged == [
        ("effect_start", 0),
        ("effect_end", 0),
        ("effect_start", 1),  # no end for the failed one
        ("effect_start", 101),
        ("effect_end", 101),
    ]


def test_the_deadline_fires_once_in_place_of_the_effect_and_never_into_a_teardown():
    seen, handled = [], []
    clock = {"late": False}

    def handle(e):
        handled.append(e.n)
        clock["late"] = True  # expired from the second effect on, the teardown's included

    with pytest.raises(TimeoutError, match="late"):
        run_blocking(
            steps(seen, catch=False), handle, deadline=Deadline(lambda: clock["late"], lambda: TimeoutError("late"))
        )
    assert handled == [0]  # the second effect was not handled: the timeout took its place

    def teardown():
        try:
            yield Step(0)
            yield Step(1)
        except TimeoutError:
            yield Step(9)  # handled although the deadline has passed
            raise

    handled.clear()
    clock["late"] = False
    with pytest.raises(TimeoutError):
        run_blocking(teardown(), handle, deadline=Deadline(lambda: clock["late"], lambda: TimeoutError("late")))
    assert handled == [0, 9]

    def fails_late(e):  # a handler failure first, the deadline passing meanwhile
        handled.append(e.n)
        if e.n == 1:
            clock["late"] = True
            raise TimeoutError("the handler's own")

    handled.clear()
    clock["late"] = False
    with pytest.raises(TimeoutError, match="the handler's own"):
        run_blocking(teardown(), fails_late, deadline=Deadline(lambda: clock["late"], lambda: TimeoutError("late")))
    assert handled == [0, 1, 9]


def test_a_base_exception_leaves_the_loop_without_resuming_the_generator():
    seen = []

    def handle(e):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_blocking(steps(seen, catch=True), handle)
    assert seen == []


def test_a_halt_with_an_error_ends_the_generator_and_is_logged_as_the_error():
    seen, records = [], []
    value = run_blocking(
        steps(seen),
        lambda e: Halt("stopped") if e.n == 1 else None,
        log=EffectLog(records.append, lambda: 0.0, "p", "rollout"),
    )
    assert value is None and seen == ["after 0"]
    assert records[-1]["error"] == "stopped" and "result" not in records[-1]
