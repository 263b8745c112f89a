"""RLix's own scheduler in differential mode against the model: agreement on bundled
scenarios and fuzz seeds for each pinned commit, a deliberate model change found with a
replayable trace, version drift in one line. The pinned RLix archives are read from
$RLHARNESS_UPSTREAM (docs/importers.md); the tests that need them skip without them."""

from __future__ import annotations

import os
import tarfile

import pytest

from harness.logs.records import Record, read_records
from harness.scheduler import planner as model_planner
from harness.scheduler.options import SchedulerOptions
from rlharness.cli import main
from simulators.config_import.table import HOW, RLIX, upstream_dir
from simulators.fuzz.generate import scenario_for_seed
from simulators.rlix_live.differential import differential
from simulators.rlix_live.loader import RlixLoadError, load_rlix
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UPSTREAM = upstream_dir()
needs_rlix = pytest.mark.skipif(UPSTREAM is None, reason=HOW)
COMMIT_OPTIONS = {"f77d913": {}, "d455b0c": {"demand_floor": True}, "a8460a9": {}}


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    out = {}
    tmp = tmp_path_factory.mktemp("rlix")
    for archive in RLIX:
        commit = archive.split("-")[1].split(".")[0]
        with tarfile.open(os.path.join(UPSTREAM, archive)) as tar:
            tar.extractall(tmp, filter="data")
        out[commit] = str(tmp / f"rlix-{commit}")
    return out


def _trace(scenario):
    return [Record(i + 1, r) for i, r in enumerate(Simulation(scenario).run().records)]


@needs_rlix
@pytest.mark.parametrize("commit", sorted(COMMIT_OPTIONS))
def test_the_model_agrees_with_each_pinned_rlix(checkouts, commit):
    mods = load_rlix(checkouts[commit])
    assert mods.version == commit
    options = SchedulerOptions(**COMMIT_OPTIONS[commit])
    cycles = 0
    for scenario in [
        load_scenario(os.path.join(ROOT, "examples", "scenarios", f"{n}.yaml"))
        for n in ("gap_ratio_3pipelines", "ungrantable_preemption", "miles_floor_reactivates_after_release")
    ] + [scenario_for_seed(seed) for seed in range(3)]:
        res = differential(_trace(scenario), mods, options)
        assert res.divergence is None, (scenario.name, res.divergence)
        cycles += res.cycles
    assert cycles > 300


@needs_rlix
def test_a_model_change_is_a_divergence_with_a_replayable_trace(checkouts, monkeypatch, tmp_path, capsys):
    original = model_planner.demand_rows

    def doubled_first_demand(plan, inp, removed):  # the deliberate change: one pipeline's demand counts twice
        rows, weights, active = original(plan, inp, removed)
        if rows and rows[0][5]:
            rows[0] = rows[0][:3] + (rows[0][3] * 2,) + rows[0][4:]
            weights[0] *= 2
        return rows, weights, active

    monkeypatch.setattr(model_planner, "demand_rows", doubled_first_demand)
    scenario = os.path.join(ROOT, "examples", "scenarios", "gap_ratio_3pipelines.yaml")
    out = tmp_path / "div.jsonl"
    assert main(["differential", scenario, "--rlix", checkouts["f77d913"], "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "DIVERGED at cycle" in text and "model:" in text and "rlix:" in text and "inputs since" in text
    replayed = differential(read_records(str(out)), load_rlix(checkouts["f77d913"]))
    assert replayed.divergence is not None and replayed.divergence.model != replayed.divergence.rlix
    monkeypatch.setattr(model_planner, "demand_rows", original)
    assert differential(read_records(str(out)), load_rlix(checkouts["f77d913"])).divergence is None


def _fake_checkout(tmp_path, with_cycle: bool):
    files = {
        "rlix/__init__.py": "",
        "rlix/protocol/__init__.py": "",
        "rlix/protocol/types.py": "import enum\nclass Priority(enum.IntEnum):\n    GENERATION = 6\nclass ProgressReport: pass\n",
        "rlix/scheduler/__init__.py": "",
        "rlix/scheduler/types.py": "",
        "rlix/scheduler/scheduler.py": (
            "import ray\nfrom ray.exceptions import ActorDiedError\nCOORDINATOR_ACTOR_NAME_PREFIX = 'c_'\n"
            "def validate_execution_plan(plan, **kw): pass\nclass SchedulerImpl:\n"
            + "".join(
                f"    async def {m}(self, **kw): pass\n"
                for m in (
                    "initialize",
                    "register_pipeline",
                    "admit_pipeline",
                    "unregister_pipeline",
                    "request_gpus",
                    "notify_release_gpus",
                    "notify_release_then_request_gpus",
                    "await_release_gpus",
                    "report_progress",
                    "clear_progress",
                )
                + (("scheduling_cycle",) if with_cycle else ())
            )
        ),
    }
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_version_drift_is_one_line(tmp_path, capsys):
    drifted = _fake_checkout(tmp_path, with_cycle=False)
    with pytest.raises(RlixLoadError, match=r"interfaces changed, missing SchedulerImpl.scheduling_cycle$"):
        load_rlix(drifted)
    scenario = os.path.join(ROOT, "examples", "scenarios", "default.yaml")
    assert main(["differential", scenario, "--rlix", drifted, "--out", str(tmp_path / "d.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SchedulerImpl.scheduling_cycle" in err


def test_the_stand_in_ray_is_only_there_while_rlix_imports(tmp_path):
    import sys

    before = sys.modules.get("ray")
    mods = load_rlix(_fake_checkout(tmp_path, with_cycle=True))
    assert sys.modules.get("ray") is before and "rlix" not in sys.modules
    assert mods.scheduler.ActorDiedError.__name__ == "ActorDiedError"


@needs_rlix
@pytest.mark.parametrize(
    "name,commit", [("gap_ratio_3pipelines", "f77d913"), ("miles_floor_reactivates_after_release", "d455b0c")]
)
def test_rlix_in_the_loop_writes_the_models_event_log(checkouts, name, commit):
    """scheduler.implementation: rlix — RLix decides every cycle; where it decides as the
    model does, every record of the run (decisions, runtime, memory) is the model run's."""
    import json

    from simulators.scenario.loader import read_mapping, scenario_from_mapping

    data = read_mapping(os.path.join(ROOT, "examples", "scenarios", f"{name}.yaml"))
    model_run = Simulation(scenario_from_mapping(data, "model")).run()
    live = dict(data, scheduler=dict(data.get("scheduler") or {}, implementation="rlix", source=checkouts[commit]))
    rlix_run = Simulation(scenario_from_mapping(live, "rlix")).run()
    assert rlix_run.records[0]["meta"]["scheduler_implementation"] == f"rlix {commit}"
    assert [json.dumps(r) for r in rlix_run.records[1:]] == [json.dumps(r) for r in model_run.records[1:]]
    assert sum(r["kind"] == "plan" for r in rlix_run.records) > 50


def test_a_drifted_rlix_in_a_scenario_is_bad_input(tmp_path, capsys):
    drifted = _fake_checkout(tmp_path / "rlix", with_cycle=False)
    scenario = tmp_path / "s.yaml"
    base = open(os.path.join(ROOT, "examples", "scenarios", "default.yaml")).read()
    scenario.write_text(
        base + f"\nscheduler: {{implementation: rlix, source: {drifted}}}\n" if "scheduler:" not in base else base
    )
    assert main(["validate", str(scenario)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "scheduler.source" in err and "SchedulerImpl.scheduling_cycle" in err
    scenario.write_text(base + "\nscheduler: {implementation: sglang}\n")
    assert main(["validate", str(scenario)]) == 2
    assert "scheduler.implementation" in capsys.readouterr().err
