"""Bounds before formulas: zero, negative and extreme values in every numeric field a
cost-model scenario has end as one error line naming a field (exit 2) or a valid
scenario, never as a traceback (a crash is never a finding).

The cost model derives a scenario's costs before it is validated
(simulators/scenario/bounds.py); its formulas divide by the cluster's size and links,
the pipeline's parallel layout, the workload's batch and the efficiency factors. Each
field of each section the cost model reads is set, in turn, to each value below and the
scenario loaded in-process; a few of the same inputs go through the command line
(``--set`` and a ``sweep`` axis) to see the exit code and the one line.
"""

from __future__ import annotations

import copy
import os

import pytest
import yaml

from rlharness.cli import main
from simulators.scenario.loader import ScenarioError, scenario_from_mapping
from simulators.scenario.rules import FIELD_RULES
from simulators.scenario.spec import ClusterSpec, CostSpec, ModelSpec, PipelineSpec, WorkloadSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCENARIO = os.path.join(ROOT, "examples", "scenarios", "costmodel_7b_and_1p5b_h100.yaml")
#: zero, negative, tiny, huge, and a value past a 64-bit integer
VALUES = (0, -1, -2.5, 1e-300, 1e300, 2**70, 0.5, 3)


def _base() -> dict:
    with open(SCENARIO, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _targets():
    """(section path, where to put it, rules) for every numeric field a cost-model scenario reads."""
    sections = [
        ("cluster", lambda m: m["cluster"], ClusterSpec),
        ("costs", lambda m: m.setdefault("costs", {}), CostSpec),
        ("pipelines[0]", lambda m: m["pipelines"][0], PipelineSpec),
        ("pipelines[0].model", lambda m: m["pipelines"][0]["model"], ModelSpec),
        ("pipelines[0].workload", lambda m: m["pipelines"][0]["workload"], WorkloadSpec),
        ("pipelines[1].costs", lambda m: m["pipelines"][1].setdefault("costs", {}), CostSpec),
    ]
    for path, where, cls in sections:
        for name, rule in FIELD_RULES[cls].items():
            if rule.kind in ("int", "float"):
                yield path, where, name


def test_every_numeric_field_of_a_cost_model_scenario_is_bounded_before_the_formulas():
    base = _base()
    loaded = refused = 0
    for path, where, name in _targets():
        for value in VALUES:
            data = copy.deepcopy(base)
            where(data)[name] = value
            try:
                scenario_from_mapping(data, "fuzzed")
                loaded += 1
            except ScenarioError as e:
                text = str(e)
                assert "\n" not in text and text.startswith("fuzzed: "), text
                refused += 1
            except Exception as e:  # a crash: the test's failure names the input
                pytest.fail(f"{path}.{name} = {value!r}: {type(e).__name__}: {e}")
    assert loaded and refused  # both outcomes happen: the values reach past the bounds and inside them


@pytest.mark.parametrize(
    "argv, field",
    [
        (["simulate", SCENARIO, "--set", "pipelines[0].infer_tp=0"], "pipelines[0].infer_tp"),
        (["simulate", SCENARIO, "--set", "cluster.vram_bytes=0"], "cluster.vram_bytes"),
        (["simulate", SCENARIO, "--set", "cluster.gpus_per_node=0"], "cluster.gpus_per_node"),
        (["simulate", SCENARIO, "--set", "pipelines[p7b].train_tp=-3"], "pipelines[0].train_tp"),
        (["sweep", SCENARIO, "--set", "pipelines[0].infer_tp=2,0"], "pipelines[0].infer_tp"),
    ],
)
def test_the_crash_inputs_exit_2_with_one_line_naming_the_field(tmp_path, capsys, argv, field):
    code = main(argv + ["--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and f"{field}:" in err, err
    assert not (tmp_path / "out").exists()


def test_a_model_preset_on_nodes_of_zero_gpus_names_gpus_per_node(tmp_path):
    data = _base()
    data["cluster"] = {"nodes": 2, "gpus_per_node": 0, "gpu": "h100_sxm"}
    data["pipelines"] = data["pipelines"][:1]
    data["pipelines"][0]["train_gpus"], data["pipelines"][0]["infer_gpus"] = [0, 1, 2], [0, 1, 2, 3]
    with pytest.raises(ScenarioError, match=r"cluster\.gpus_per_node: must be > 0"):
        scenario_from_mapping(data, "zero-gpus")


def test_every_numeric_field_through_set_and_a_sweep_axis_is_one_line_or_valid():
    """The same values as ``--set PATH=VALUE`` text (parsed as YAML and applied as the
    command does, then the layout rules), and a few fields as a sweep axis: one line
    (exit 2) or a scenario, never another exception."""
    from simulators.scenario.overrides import OverrideError, apply_overrides, parse_override, scenario_mapping
    from simulators.scenario.loader import check_feasible
    from simulators.whatif.grid import build_grid, parse_axis

    mapping, _ = scenario_mapping(SCENARIO)
    checked = 0
    for path, _where, name in _targets():
        for text in ("0", "-1", "1e300", ".inf", "1e-300", "2e19"):
            try:
                check_feasible(
                    scenario_from_mapping(
                        apply_overrides(copy.deepcopy(mapping), [parse_override(f"{path}.{name}={text}")]), "s"
                    ),
                    "s",
                )
            except (OverrideError, ScenarioError) as e:
                assert "\n" not in str(e), str(e)
            except Exception as e:
                pytest.fail(f"--set {path}.{name}={text}: {type(e).__name__}: {e}")
            checked += 1
    assert checked > 500
    for axis in (
        "pipelines[0].infer_tp=2,0",
        "cluster.gpus_per_node=8,0",
        "costs.train_mfu=0.3,0,2",
        "pipelines[0].workload.prompts_per_step=8,-1",
    ):
        with pytest.raises((OverrideError, ScenarioError)):
            build_grid(SCENARIO, [parse_axis(axis)])
