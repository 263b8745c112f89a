"""Schedule exploration: seeded orders of same-time events, deterministic per seed."""

from __future__ import annotations

import json

import pytest

from harness.logs.invariants import check_log
from rlharness.cli import main
from simulators.pipelines.cache_lock import CacheLock
from simulators.runtime.env import Link, SimEnv
from simulators.runtime.explore import Explorer, ExploreSpec
from simulators.runtime.simulation import Simulation
from simulators.scenario.spec import default_scenario


def _order(explorer):
    """Three processes each log twice at t=1 (two events per process): the order they ran."""
    env = SimEnv(explorer=explorer)
    seen = []

    def proc(name):
        yield env.timeout(1)
        seen.append((name, 1))
        yield env.timeout(0)
        seen.append((name, 2))

    for i, name in enumerate("abc"):
        env.spawn(proc(name), "pipeline", i)
    env.run()
    return seen


def test_without_an_explorer_the_fixed_key_orders_processes():
    assert [n for n, _ in _order(None)] == ["a", "a", "b", "b", "c", "c"]  # same instant: key, then program order


@pytest.mark.parametrize("strategy", ["random", "pct"])
def test_seeds_reorder_processes_but_never_a_process_own_steps(strategy):
    orders = {tuple(_order(Explorer(ExploreSpec(seed, strategy, steps=20)))) for seed in range(40)}
    assert len({tuple(n for n, k in o if k == 1) for o in orders}) > 1  # some seed changes who goes first
    for o in orders:
        for name in "abc":
            assert [k for n, k in o if n == name] == [1, 2]  # program order kept


def test_a_seed_replays_the_same_log():
    a = Simulation(default_scenario(), explore=ExploreSpec(3, "random")).run()
    b = Simulation(default_scenario(), explore=ExploreSpec(3, "random")).run()
    lines = list(a.log.lines())
    assert lines == list(b.log.lines())
    assert json.loads(lines[0])["meta"]["explore"] == {"seed": 3, "strategy": "random", "max_delay_s": 0.01}


def test_explored_runs_of_the_default_scenario_stay_clean():
    logs = set()
    for seed in range(6):
        for strategy in ("random", "pct"):
            res = Simulation(default_scenario(), explore=ExploreSpec(seed, strategy)).run()
            assert res.reason == "done" and check_log(res.records) == []
            logs.add(tuple(list(res.log.lines())[1:]))
    assert len(logs) > 1  # exploration reaches other interleavings of this scenario


def test_pct_change_points_lower_the_ranked_process():
    ex = Explorer(ExploreSpec(0, "pct", depth=3, steps=2))  # change points at rankings 1 and 2
    first = ex.rank((1,), 0.0, 0.0)
    second = ex.rank((2,), 0.0, 0.0)
    later = ex.rank((3,), 0.0, 0.0)
    assert first > later and second > later  # the two changed processes now rank after a fresh one
    assert ex.rank((1,), 0.0, 0.0) == first  # fixed once asked for that instant


def test_pct_change_points_take_their_priorities_in_the_draws_order_not_in_time():
    # Burckhardt et al.: the i-th drawn change point k_i gives priority i; the draw is
    # unordered, so which of two changed processes ranks first is the seed's, not time's
    orders = set()
    for seed in range(40):
        ex = Explorer(ExploreSpec(seed, "pct", depth=3, steps=2))
        first, second = ex.rank((1,), 0.0, 0.0), ex.rank((2,), 0.0, 0.0)
        assert {first, second} == {-1.0, -2.0}  # both below every unchanged process (< -depth)
        orders.add(first < second)
    assert orders == {True, False}


def test_pct_counts_the_runs_scheduling_points_and_the_header_names_them():
    from simulators.runtime.explore import _PILOTS

    scen = default_scenario()
    res = Simulation(scen, explore=ExploreSpec(5, "pct")).run()
    k = json.loads(list(res.log.lines())[0])["meta"]["explore"]["steps"]
    assert k == _PILOTS[repr(scen)]
    pilot = Simulation(scen, explore=ExploreSpec(0, "fixed", max_delay_s=0.0))
    pilot.run()
    assert k == pilot.env.explorer.rankings > 100  # the fixed order's rankings: the paper's k
    again = Simulation(scen, explore=ExploreSpec(5, "pct", steps=k)).run()  # an explicit k: the same run
    assert list(again.log.lines()) == list(res.log.lines())


def test_cli_explore_is_deterministic_and_checked(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "simulate",
                "--quiet",
                "--no-png",
                "--explore",
                "5",
                "--explore-strategy",
                "random",
                "--out",
                str(out),
                "--check-determinism",
            ]
        )
        == 0
    )
    assert "byte-identical" in capsys.readouterr().out
    assert main(["simulate", "--quiet", "--explore", "-3", "--out", str(tmp_path / "bad")]) == 2
    assert "--explore: must be in" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown exploration strategy"):
        Explorer(ExploreSpec(0, "dfs"))


class _Sim:
    """What CacheLock needs of a simulation: an env and a logger."""

    def __init__(self, env):
        self.env, self.logged = env, []

    def emit(self, kind, **fields):
        self.logged.append((self.env.now, fields["action"], fields["holder"]))


def _cache_lock_handoff(explorer):
    """A holder and three waiters (processes 1..3, queued in that order): who got the lock, when."""
    env = SimEnv(explorer=explorer)
    sim = _Sim(env)
    lock = CacheLock(sim, "p")

    def holder():
        yield from lock.acquire("h0", None)
        yield env.timeout(1)
        lock.release(None)

    def waiter(i):
        yield env.timeout(0.5)
        yield from lock.acquire(f"w{i}", None)
        yield env.timeout(1)
        lock.release(None)

    env.spawn(holder(), "pipeline", 0)
    for i in (1, 2, 3):
        env.spawn(waiter(i), "pipeline", i)
    env.run()
    return [(t, h) for t, a, h in sim.logged if a == "acquire"]


def _coordinator_handoff(explorer):
    env = SimEnv(explorer=explorer)
    lock, got = Link(env, 1, unordered=True), []

    def user(i, wait):
        yield env.timeout(wait)
        with lock.request() as req:
            yield req
            got.append(i)
            yield env.timeout(1)

    for i in range(4):
        env.spawn(user(i, 0 if i == 0 else 0.5), "resize", i)
    env.run()
    return got


def test_lock_hand_off_is_fifo_unexplored_and_chosen_by_the_seed_explored():
    assert [h for _, h in _cache_lock_handoff(None)] == ["h0", "w1", "w2", "w3"]
    assert _coordinator_handoff(None) == [0, 1, 2, 3]
    for strategy in ("random", "pct"):
        cache = {
            tuple(h for _, h in _cache_lock_handoff(Explorer(ExploreSpec(s, strategy, steps=20, max_delay_s=0.0))))
            for s in range(30)
        }
        coord = {tuple(_coordinator_handoff(Explorer(ExploreSpec(s, strategy, steps=20)))) for s in range(30)}
        assert len({o[1] for o in cache}) > 1 and len({o[1] for o in coord}) > 1  # another waiter goes first
        assert all(o[0] == "h0" and sorted(o[1:]) == ["w1", "w2", "w3"] for o in cache)  # one holder at a time
        assert all(o[0] == 0 and sorted(o) == [0, 1, 2, 3] for o in coord)
    ex = lambda: Explorer(ExploreSpec(7, "random"))  # noqa: E731
    assert _cache_lock_handoff(ex()) == _cache_lock_handoff(ex())  # a seed replays its hand-offs


def test_seeded_delays_are_bounded_on_their_grid_and_replay():
    spec = ExploreSpec(11, "pct", steps=20, max_delay_s=0.02)
    draws = lambda: [ex.delay() for ex in [Explorer(spec)] for _ in range(400)]  # noqa: E731
    a = draws()
    assert a == draws()
    assert 120 < a.count(0.0) < 280  # about half the draws add nothing
    assert all(0 <= d <= 0.02 + 1e-12 and abs(d / 0.0002 - round(d / 0.0002)) < 1e-6 for d in a)
    assert max(a) > 0.015
    # the holder of a lock holds it longer by its delay: acquires come later than unexplored
    held = _cache_lock_handoff(Explorer(ExploreSpec(1, "random")))
    assert [t for t, _ in held] != [t for t, _ in _cache_lock_handoff(None)]
    assert all(t <= i * 1.0 + i * 0.01 + 1e-9 for i, (t, _) in enumerate(held))


def test_delays_change_an_explored_run_and_stay_within_the_scenario():
    runs = {d: Simulation(default_scenario(), explore=ExploreSpec(2, "pct", max_delay_s=d)).run() for d in (0.0, 0.01)}
    for res in runs.values():
        assert res.reason == "done" and check_log(res.records) == []
    assert [r for r in runs[0.0].records[1:]] != [r for r in runs[0.01].records[1:]]
