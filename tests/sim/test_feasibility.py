"""Layouts certain to fail are refused before anything runs (simulators/scenario/feasibility.py).

Each infeasible layout below is (1) refused by ``rlharness validate`` and ``simulate`` in
one line naming the field and the rule, before any simulation, and (2) run through the
simulator with the check bypassed, where it ends in the out-of-memory failure the rule
predicts: the rule is about the model's own behaviour, not a guess. A fresh-clone trial
found the single-controller case called valid and then failing at t = 2.6 s.
"""

from __future__ import annotations

import glob
import os

import pytest
import yaml

from rlharness.cli import main
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario, scenario_from_mapping

from tests.cli.test_cli_error_contract import ROOT, run_error

GiB = 1 << 30
ALL16 = list(range(16))

INFEASIBLE = {
    # NeMo's single controller holds GPU 1 for its whole run; the RLix pipeline wakes a rank there
    "sc_overlap": (
        {
            "cluster": {"nodes": 1, "gpus_per_node": 4},
            "pipelines": [
                {"name": "rl", "type": "nemo_async", "train_gpus": [0], "infer_gpus": [0, 1]},
                {"name": "sc", "type": "single_controller", "train_gpus": [2], "infer_gpus": [1]},
            ],
        },
        "pipelines[1].infer_gpus",
        "single_controller_exclusive",
        "rl expand",
    ),
    # 7B parameters trained on one 80 GiB GPU: 8 x 14 GB of training state
    "big_model": (
        {
            "cluster": {"nodes": 1, "gpus_per_node": 2},
            "pipelines": [
                {"name": "big", "type": "roll_sync", "train_gpus": [0], "infer_gpus": [0, 1], "model": {"params": 7e9}}
            ],
        },
        "pipelines[0].model.params",
        "init_fits",
        "big/train asked for",
    ),
    # 14B parameters trained over 16 GPUs fits, but one unsharded inference copy (28 GB) does not fit 24 GiB
    "shard": (
        {
            "cluster": {"nodes": 2, "gpus_per_node": 8, "vram_bytes": 24 * GiB},
            "pipelines": [
                {
                    "name": "wide",
                    "type": "roll_sync",
                    "train_gpus": ALL16,
                    "infer_gpus": ALL16,
                    "model": {"params": 14e9},
                }
            ],
        },
        "pipelines[0].infer_tp",
        "wake_fits",
        "wide/dp0 asked for 28000000000 B of weights",
    ),
    # the KV cache takes the whole GPU, the CUDA context is already there
    "kv_full": (
        {
            "cluster": {"nodes": 1, "gpus_per_node": 2},
            "costs": {"kv_cache_fraction": 1.0},
            "pipelines": [{"name": "p", "type": "nemo_async", "train_gpus": [0], "infer_gpus": [0, 1]}],
        },
        "costs.kv_cache_fraction",
        "wake_fits",
        "of kv_cache",
    ),
}


def _write(tmp_path, name, data):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(dict(name=name, **data), sort_keys=False))
    return str(path)


@pytest.mark.parametrize("name", sorted(INFEASIBLE))
def test_validate_refuses_in_one_line(name, tmp_path, capsys):
    data, field, rule, _ = INFEASIBLE[name]
    path = _write(tmp_path, name, data)
    line = run_error(["validate", path], capsys, f"{path}: {field}: ", f"(rule: {rule})")
    assert "GiB" in line or "GPU(s)" in line


@pytest.mark.parametrize("name", sorted(INFEASIBLE))
def test_simulate_refuses_before_simulating(name, tmp_path, capsys, monkeypatch):
    import simulators.run

    def refuse(*a, **k):
        raise AssertionError("an infeasible layout must be refused before the simulation starts")

    monkeypatch.setattr(simulators.run, "simulate", refuse)
    data, field, rule, _ = INFEASIBLE[name]
    run_error(["simulate", _write(tmp_path, name, data), "--out", str(tmp_path / "run")], capsys, field, rule)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", sorted(INFEASIBLE))
def test_the_simulator_fails_as_the_rule_says(name):
    """With the check bypassed (the mapping loader does not apply it), the run is an OOM."""
    data, _, _, detail = INFEASIBLE[name]
    res = Simulation(scenario_from_mapping(dict(name=name, **data), name)).run()
    assert res.reason == "failed" and "OOM" in res.detail and detail in res.detail, res.detail


def test_one_gpu_more_makes_the_big_model_fit(tmp_path, capsys):
    """The init rule counts per-GPU state: spread over two GPUs, 7B parameters are accepted."""
    data = INFEASIBLE["big_model"][0]
    data = dict(data, pipelines=[dict(data["pipelines"][0], train_gpus=[0, 1])])
    assert main(["validate", _write(tmp_path, "big2", data)]) == 0


def test_single_controllers_side_by_side_are_fine(tmp_path):
    data = {
        "cluster": {"nodes": 1, "gpus_per_node": 4},
        "pipelines": [
            {"name": "a", "type": "single_controller", "train_gpus": [0], "infer_gpus": [1]},
            {"name": "b", "type": "nemo_async", "train_gpus": [2], "infer_gpus": [2, 3]},
        ],
    }
    load_scenario(_write(tmp_path, "apart", data))


def _bundled_scenarios():
    """Every scenario file under examples/ (examples/fuzz also holds a findings baseline)."""
    paths = glob.glob(os.path.join(ROOT, "examples", "scenarios", "*.yaml"))
    paths += [p for p in glob.glob(os.path.join(ROOT, "examples", "fuzz", "*.yaml")) if "pipelines:" in open(p).read()]
    return sorted(paths)


@pytest.mark.parametrize("path", _bundled_scenarios(), ids=os.path.basename)
def test_every_bundled_scenario_is_feasible(path, capsys):
    assert main(["validate", path]) == 0, capsys.readouterr().err


def test_every_rule_is_documented():
    import re

    from simulators.scenario import feasibility as scenario_feasibility

    source = open(scenario_feasibility.__file__).read()
    rules = set(re.findall(r"\(rule: (\w+)\)", source))
    doc = open(os.path.join(ROOT, "docs", "feasibility.md")).read()
    assert rules == {"single_controller_exclusive", "init_fits", "wake_fits"}
    assert all(f"`{r}`" in doc for r in rules)


def test_validate_reports_the_static_worst_case_wake_headroom_the_run_then_meets(capsys):
    """``validate`` adds the static plan's tightest wake headroom (and says when it is under
    the margin); the simulated run's summary finds the same least headroom after a handover."""
    from harness.logs.outputs.run_view import RunView

    path = os.path.join(ROOT, "examples", "scenarios", "handover_headroom_tight.yaml")
    assert main(["validate", path]) == 0
    line = capsys.readouterr().out
    assert "static worst-case wake headroom 2.76 GiB on GPU 0" in line and "(under the 3.00 GiB margin)" in line
    records = Simulation(load_scenario(path)).run().records
    h = RunView(records).derived("headroom")
    assert f"{min(w.headroom for w in h.handovers) / (1 << 30):.2f}" == "2.76"
