"""The keyed simpy environment: same-time order by key, and what its lean stand-ins
(:class:`Timer`, :class:`Link`) and the timer-driven request completions must do."""

from __future__ import annotations

import pytest
import simpy
from simpy.core import NORMAL

from harness.control.rank_state import RankLifecycle
from simulators.runtime.env import Actor, Link, SimEnv, Timer
from simulators.pipelines.inference import RankSim, Request, Router


def test_same_time_wakeups_follow_the_key_not_the_creation_order():
    env, seen = SimEnv(), []

    def proc(name):
        yield env.timeout(1)
        seen.append(name)

    env.spawn(proc("rank"), "rank", 0, 0)
    env.spawn(proc("pipeline 1"), "pipeline", 1)
    env.spawn(proc("pipeline 0"), "pipeline", 0)
    env.spawn(proc("scheduler"), "scheduler", 0)
    env.run()
    assert seen == ["scheduler", "pipeline 0", "pipeline 1", "rank"]


def test_a_timer_runs_its_callback_once_at_its_time_and_keys_what_it_schedules_by_its_actor():
    env, seen = SimEnv(), []

    def fire(arg):
        follow_up = env.timeout(0)
        (key,) = [prio for _t, prio, _eid, ev in env._queue if ev is follow_up]
        seen.append((arg, env.now, env.active_process.order_key, key))

    Timer(env, 1.0, Actor("rank", 2, 3), fire, "fired")
    env.run()
    # the follow-up carries the rank's key, as if the rank's process had scheduled it
    # (scheduled by no one, it would carry the root key (-1,) and jump every process)
    assert seen == [("fired", 1.0, (5, 2, 3), (NORMAL, (5, 2, 3)))]
    assert env.active_process is None


def _contend(make_resource):
    """Three processes contending for a capacity-1 resource; the (time, who, what) trace."""
    env, trace = SimEnv(), []
    res = make_resource(env)

    def user(name, arrive, hold):
        yield env.timeout(arrive)
        with res.request() as req:
            trace.append((env.now, name, "asks"))
            yield req
            trace.append((env.now, name, "holds"))
            yield env.timeout(hold)
        trace.append((env.now, name, "left"))

    for i, (arrive, hold) in enumerate([(0, 2), (1, 1), (1, 3)]):
        env.spawn(user(f"u{i}", arrive, hold), "pipeline", i)
    env.run()
    return trace, env.scheduled_events()


def test_link_schedules_what_simpy_resource_would():
    assert _contend(lambda env: Link(env, 1)) == _contend(lambda env: simpy.Resource(env, 1))


def _router(env, log):
    done = []
    router = Router(
        env,
        "p",
        0,
        max_concurrent=4,
        tokens_per_s=100.0,
        half_point=0.0,
        log=log.append,
        on_done=lambda req, rank: done.append((env.now, req.rid, req.attempt)),
    )
    rank = RankSim("p", 0, (0,), RankLifecycle("p", 0))
    router.ranks = {0: rank}
    return router, rank, done


def test_a_request_aborted_mid_decode_completes_once_after_its_redispatch():
    env, log = SimEnv(), []
    router, rank, done = _router(env, log)

    def driver():
        router.activate([rank])
        router.submit([Request(1, tokens=100)])  # alone: 100 * (0 + 1 + 0) / 100 = 1 s
        yield env.timeout(0.5)
        router.deactivate([rank])  # aborted: back to the queue; its timer (due at 1.0) goes stale
        yield env.timeout(1.0)
        router.activate([rank])  # re-dispatched at 1.5, due at 2.5

    env.spawn(driver(), "pipeline", 0)
    env.run()
    assert done == [(2.5, 1, 1)]
    assert [(r["kind"], r["t"]) for r in log] == [
        ("request_dispatch", 0),
        ("request_abort", 0.5),
        ("request_dispatch", 1.5),
        ("request_done", 2.5),
    ]
    assert rank.inflight == {} and router.completed == 1 and router.aborted == 1


def test_a_freed_slot_is_refilled_when_a_completion_fires():
    env, log = SimEnv(), []
    router, rank, done = _router(env, log)
    router.max_concurrent = 1
    router.activate([rank])
    router.submit([Request(1, tokens=100), Request(2, tokens=50)])
    env.run()
    assert done == [(1.0, 1, 0), (1.5, 2, 0)]  # the second waited for the only slot


def test_run_until_an_event_ends_as_simpys_run_does():
    """SimEnv.run inlines simpy's step: the until event's value is returned, an event the
    schedule never reaches is a RuntimeError, and a failure nobody defused ends the run."""
    env = SimEnv()
    done = env.event()

    def finisher():
        yield env.timeout(2)
        done.succeed("finished")

    env.spawn(finisher(), "pipeline", 0)
    assert env.run(until=done) == "finished" and env.now == 2

    env = SimEnv()
    never = env.event()

    def idle():
        yield env.timeout(1)

    env.spawn(idle(), "pipeline", 0)
    with pytest.raises(RuntimeError, match="No scheduled events left"):
        env.run(until=never)

    env = SimEnv()

    def crasher():
        yield env.timeout(1)
        raise ValueError("boom")

    env.spawn(crasher(), "pipeline", 0)
    with pytest.raises(ValueError, match="boom"):
        env.run(until=env.event())
