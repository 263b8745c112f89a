"""Schedule exploration: seeded orders of same-time events, deterministic per seed."""

from __future__ import annotations

import json

import pytest

from harness.invariants import check_log
from rlharness.cli import main
from simulators.env import SimEnv
from simulators.explore import Explorer, ExploreSpec
from simulators.runtime import Simulation
from simulators.spec import default_scenario


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
    orders = {tuple(_order(Explorer(ExploreSpec(seed, strategy)))) for seed in range(40)}
    assert len({tuple(n for n, k in o if k == 1) for o in orders}) > 1  # some seed changes who goes first
    for o in orders:
        for name in "abc":
            assert [k for n, k in o if n == name] == [1, 2]  # program order kept


def test_a_seed_replays_the_same_log():
    a = Simulation(default_scenario(), explore=ExploreSpec(3, "random")).run()
    b = Simulation(default_scenario(), explore=ExploreSpec(3, "random")).run()
    lines = list(a.log.lines())
    assert lines == list(b.log.lines())
    assert json.loads(lines[0])["meta"]["explore"] == {"seed": 3, "strategy": "random"}


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


def test_cli_explore_is_deterministic_and_checked(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--quiet", "--no-png", "--explore", "5", "--explore-strategy", "random",
                 "--out", str(out), "--check-determinism"]) == 0
    assert "byte-identical" in capsys.readouterr().out
    assert main(["simulate", "--quiet", "--explore", "-3", "--out", str(tmp_path / "bad")]) == 2
    assert "--explore: must be in" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown exploration strategy"):
        Explorer(ExploreSpec(0, "dfs"))
