"""``rlharness fuzz --explore K``: schedule seeds per scenario seed, families of runs that
differ only by schedule, reproducers that carry the schedule, whichever executor."""

from __future__ import annotations

import json

import pytest

from rlharness.cli import main
from simulators.runtime.explore import ExploreSpec
from simulators.fuzz.executors import Job, run_isolated
from simulators.fuzz.schedules import SCHEDULE_ONLY, mark_families
from simulators.fuzz.seed_run import run_scenario
from simulators.fuzz.sweep import SweepConfig, format_table, results_json, run_sweep
from simulators.scenario.loader import load_scenario

# Scenario seed 31 (two roll_sync pipelines and a nemo_async one, fault offload_keeps_params):
# the fixed order's first violation is a handover naming both pipeline types; pct schedule
# seeds 0, 2 and 3 reorder the same instant's two grants, so the first violation names only
# roll_sync: a signature only some schedules give.
SEED, SCHEDULE_ONLY_SIG = 31, "handover[roll_sync] +offload_keeps_params"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz-explore")
    return run_sweep(SweepConfig(seeds=1, start=SEED, explore=4, workers=2, out_dir=str(out)))


def test_each_seed_runs_the_fixed_order_then_k_schedule_seeds_in_that_order(sweep):
    runs = [(r["seed"], r.get("explore")) for r in sweep.results]
    assert runs == [(SEED, None)] + [(SEED, {"seed": k, "strategy": "pct"}) for k in range(4)]
    fixed = sweep.results[0]["signature"]
    assert fixed != SCHEDULE_ONLY_SIG and "family" not in sweep.results[0]
    fams = {r["explore"]["seed"]: r.get("family") for r in sweep.results[1:]}
    assert fams == {0: SCHEDULE_ONLY, 1: "fixed-order", 2: SCHEDULE_ONLY, 3: SCHEDULE_ONLY}


def test_runs_differing_only_by_schedule_are_one_family_and_the_table_says_schedule_only(sweep):
    f = next(f for f in sweep.findings if f.signature == SCHEDULE_ONLY_SIG)
    assert (f.count, f.families, f.schedule_only, f.explore) == (3, 1, [SEED], {"seed": 0, "strategy": "pct"})
    other = next(f for f in sweep.findings if f.signature == sweep.results[0]["signature"])
    assert (other.count, other.families, other.schedule_only, other.explore) == (2, 1, [], None)
    table = format_table(sweep)
    assert "(fixed order + 4 pct schedule seed(s)) = 5 runs" in table and "1 schedule-only" in table
    assert (
        f"{SCHEDULE_ONLY_SIG}  seed {SEED}: schedule seed(s) 0, 2, 3 (3 of the sweep's schedules): "
        f"rlharness simulate " in table
    )
    assert f.reproducer.endswith(" --explore 0 --explore-strategy pct") and f.reproducer in table


def test_the_minimized_reproducer_keeps_the_schedule_seed(sweep):
    f = next(f for f in sweep.findings if f.signature == SCHEDULE_ONLY_SIG)
    assert f.minimized and f.minimize_runs > 0
    small = load_scenario(f.minimized)
    assert len(small.pipelines) < 3  # shrunk
    assert run_scenario(small, ExploreSpec(0, "pct"))["signature"] == SCHEDULE_ONLY_SIG
    with open(f.minimized, encoding="utf-8") as fh:
        assert "--explore 0 --explore-strategy pct" in fh.read()


def test_explored_results_are_byte_identical_whatever_the_worker_count():
    cfg = dict(seeds=2, start=20, explore=2, explore_strategy="random")  # 6 runs: 3 workers end them out of order
    one = results_json(run_sweep(SweepConfig(workers=1, **cfg), minimize_findings=False).results)
    three = results_json(run_sweep(SweepConfig(workers=3, **cfg), minimize_findings=False).results)
    assert one == three and len(json.loads(one)) == 6


def test_the_determinism_pass_reruns_each_schedule(fresh_process_decodes_one_more_token):
    cfg = SweepConfig(seeds=1, start=20, explore=1, workers=2, check_determinism=True)
    assert [r["determinism"] for r in run_sweep(cfg, minimize_findings=False).results] == [{"status": "identical"}] * 2
    fresh_process_decodes_one_more_token()
    explored = run_sweep(cfg, minimize_findings=False).results[1]
    assert explored["explore"] == {"seed": 0, "strategy": "pct"}
    assert explored["determinism"]["status"] == "diverged" and explored["signature"] == "nondeterministic"


def _boom(seed):
    raise RuntimeError("x")


def test_a_crashed_run_keeps_its_schedule_and_families_need_the_fixed_run():
    job = Job(4, _boom, (4,), {"explore": {"seed": 2, "strategy": "pct"}})
    (res,) = run_isolated([job], workers=1, budget=10, clock=lambda: 0.0)
    assert res["explore"] == {"seed": 2, "strategy": "pct"} and res["signature"] == "crashed:RuntimeError"
    results = [
        {"seed": 1, "signature": "a"},
        {"seed": 1, "signature": "a", "explore": {"seed": 0}},
        {"seed": 1, "signature": "b", "explore": {"seed": 1}},
        {"seed": 1, "signature": "clean", "explore": {"seed": 2}},
    ]
    mark_families(results)
    assert [r.get("family") for r in results] == [None, "fixed-order", SCHEDULE_ONLY, None]


def test_fuzz_cli_explore(tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(
        [
            "fuzz",
            "--seeds",
            "1",
            "--start",
            str(SEED),
            "--explore",
            "4",
            "--workers",
            "2",
            "--quiet",
            "--no-minimize",
            "--out",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 1 and "1 schedule-only" in text
    assert f"rlharness simulate {out}/scenarios/seed{SEED}.yaml --explore 0 --explore-strategy pct" in text
    assert (
        run_scenario(load_scenario(str(out / "scenarios" / f"seed{SEED}.yaml")), ExploreSpec(0, "pct"))["signature"]
        == SCHEDULE_ONLY_SIG
    )
    assert main(["fuzz", "--seeds", "5", "--explore", "-1", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--explore: must be between 0 and" in err
