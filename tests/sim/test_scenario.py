"""Scenario files: every example loads, round trips and is frozen; file-level errors (unreadable,
malformed YAML, not a mapping) are one line naming the file. Field-level errors are in
``test_scenario_fields.py``."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
import yaml

from simulators.scenario.loader import (
    FIELD_RULES,
    ScenarioError,
    load_scenario,
    scenario_from_mapping,
)
from simulators.scenario.dump import scenario_to_mapping
from tests.sim.scenario_cases import BASE, base
from simulators.scenario.spec import (
    ClusterSpec,
    CostSpec,
    FaultSpec,
    ModelSpec,
    PipelineSpec,
    Scenario,
    WorkloadSpec,
    default_scenario,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "scenarios"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))
EXPECTED_EXAMPLES = {
    "default",
    "roll_dual_4gpu",
    "gap_ratio_3pipelines",
    "mixed_64gpu",
    "tp2_broadcast",
    "oom_wake_before_offload",
    "large_1024gpu",
}


def write(tmp_path: Path, text: str, name: str = "x.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def assert_frozen(obj) -> None:
    """Every dataclass in the tree is frozen; every sequence is a tuple."""
    if dataclasses.is_dataclass(obj):
        assert type(obj).__dataclass_params__.frozen, type(obj).__name__
        for f in dataclasses.fields(obj):
            assert_frozen(getattr(obj, f.name))
    elif isinstance(obj, (list, set)):
        raise AssertionError(f"mutable sequence {obj!r}")
    elif isinstance(obj, tuple):
        for x in obj:
            assert_frozen(x)


# ---------------------------------------------------------------- examples


def test_all_expected_examples_exist():
    assert {p.stem for p in EXAMPLE_FILES} >= EXPECTED_EXAMPLES


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_example_loads(path: Path):
    s = load_scenario(path)
    assert isinstance(s, Scenario)
    assert s.description, "every example carries a description"
    assert s.name == path.stem
    assert_frozen(s)
    assert isinstance(s.scheduler, dict)
    if path.stem != "large_1024gpu":
        assert all(3 <= p.steps <= 6 for p in s.pipelines)


def test_default_yaml_is_default_scenario():
    s = load_scenario(EXAMPLES / "default.yaml")
    d = default_scenario()
    for f in dataclasses.fields(Scenario):
        assert getattr(s, f.name) == getattr(d, f.name), f.name
    for ps, pd in zip(s.pipelines, d.pipelines, strict=True):
        for f in dataclasses.fields(PipelineSpec):
            assert getattr(ps, f.name) == getattr(pd, f.name), (ps.name, f.name)
    assert s == d


def test_example_shapes():
    roll = load_scenario(EXAMPLES / "roll_dual_4gpu.yaml")
    assert [(p.type, p.train_gpus, p.infer_gpus) for p in roll.pipelines] == [
        ("roll_sync", (0, 1), (0, 1, 2, 3)),
        ("roll_sync", (2, 3), (0, 1, 2, 3)),
    ]
    gap = load_scenario(EXAMPLES / "gap_ratio_3pipelines.yaml")
    assert gap.cluster.num_gpus == 8 and len(gap.pipelines) == 3
    assert len({p.workload.trajectories_per_step for p in gap.pipelines}) == 3
    mixed = load_scenario(EXAMPLES / "mixed_64gpu.yaml")
    assert (mixed.cluster.nodes, mixed.cluster.gpus_per_node, len(mixed.pipelines)) == (8, 8, 8)
    assert {p.type for p in mixed.pipelines} == {"nemo_async", "roll_sync"}
    assert any(p.infer_tp == 2 for p in mixed.pipelines)
    tp2 = load_scenario(EXAMPLES / "tp2_broadcast.yaml")
    (p,) = tp2.pipelines
    assert p.infer_tp == 2 and p.train_gpus == (0,) and p.infer_gpus == (0, 1, 2, 3)
    oom = load_scenario(EXAMPLES / "oom_wake_before_offload.yaml")
    assert [(f.name, f.pipeline, f.at_step) for f in oom.faults] == [("wake_before_offload", "ppl1", 1)]
    assert oom.pipelines == default_scenario().pipelines
    large = load_scenario(EXAMPLES / "large_1024gpu.yaml")
    assert large.cluster.num_gpus == 1024 and len(large.pipelines) == 32
    assert all(len(p.infer_gpus) == 32 and len(p.train_gpus) == 8 and p.steps == 100 for p in large.pipelines)
    assert {p.type for p in large.pipelines} == {"nemo_async", "roll_sync"}


# ---------------------------------------------------------------- round trip, defaults


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_round_trip(path: Path, tmp_path: Path):
    s = load_scenario(path)
    m = scenario_to_mapping(s)
    assert scenario_from_mapping(m, "rt") == s
    # and through YAML text, as the CLI will write it next to outputs
    out = tmp_path / "resolved.yaml"
    out.write_text(yaml.safe_dump(m, sort_keys=False))
    assert load_scenario(out) == s


def test_round_trip_non_default_everything():
    s = Scenario(
        name="all",
        cluster=ClusterSpec(nodes=2, gpus_per_node=4, vram_bytes=24 << 30, pcie_bytes_per_s=12.5e9),
        pipelines=(
            PipelineSpec(
                "a",
                "roll_sync",
                (0, 1),
                (0, 1, 2, 3),
                infer_tp=2,
                steps=3,
                sleep_level=1,
                start_s=2.5,
                model=ModelSpec(params=7e9, bytes_per_param=1),
                workload=WorkloadSpec(prompts_per_step=3, decode_tokens_sigma=0.0),
            ),
            PipelineSpec("b", "nemo_async", (4,), (4, 5, 6, 7)),
        ),
        costs=CostSpec(wake_s=0.0, kv_cache_fraction=1.0, bucket_bytes=1 << 20),
        seed=7,
        horizon_s=10.0,
        scheduler={"head_of_line_blocking": True, "epsilon": 0.5, "max_gap_iterations": 3},
        faults=(FaultSpec("keep_nccl_on_sleep", "b", 2),),
        description="everything off its default",
    )
    assert scenario_from_mapping(scenario_to_mapping(s), "rt") == s


def test_defaults_merge():
    data = base()
    data["defaults"] = {
        "model": {"params": 1.5e9, "bytes_per_param": 4},
        "workload": {"prompts_per_step": 16, "decode_tokens_max": 2048},
    }
    data["pipelines"][1]["model"] = {"params": 7e9}
    data["pipelines"][1]["workload"] = {"decode_tokens_max": 4096}
    s = scenario_from_mapping(data, "x.yaml")
    p1, p2 = s.pipelines
    assert p1.model == ModelSpec(params=1.5e9, bytes_per_param=4)
    assert p2.model == ModelSpec(params=7e9, bytes_per_param=4)  # own params, default bytes_per_param
    assert p1.workload == WorkloadSpec(prompts_per_step=16, decode_tokens_max=2048)
    assert p2.workload == WorkloadSpec(prompts_per_step=16, decode_tokens_max=4096)
    assert "defaults" not in scenario_to_mapping(s)


def test_ints_accepted_for_floats_and_exponent_floats(tmp_path: Path):
    p = write(
        tmp_path,
        BASE + "horizon_s: 100\ncosts: {offload_bytes_per_s: 20e9, wake_s: 1}\ndefaults: {model: {params: 5e8}}\n",
    )
    s = load_scenario(p)
    assert s.horizon_s == 100.0 and isinstance(s.horizon_s, float)
    assert s.costs.offload_bytes_per_s == 20e9 and s.costs.wake_s == 1.0
    assert s.pipelines[0].model.params == 5e8


def test_gpu_lists_are_canonical_tuples():
    data = base()
    data["pipelines"][0]["infer_gpus"] = [1, 0]
    s = scenario_from_mapping(data, "x.yaml")
    assert s.pipelines[0].infer_gpus == (0, 1)


def test_field_rules_cover_spec():
    for cls in (ClusterSpec, ModelSpec, WorkloadSpec, CostSpec):
        assert set(FIELD_RULES[cls]) == {f.name for f in dataclasses.fields(cls)}


# ---------------------------------------------------------------- file-level errors


def test_missing_file(tmp_path: Path):
    p = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError) as info:
        load_scenario(p)
    assert str(info.value) == f"{p}: cannot read: No such file or directory"


def test_malformed_yaml(tmp_path: Path):
    p = write(tmp_path, "name: t\ncluster: {nodes: 1\npipelines: []\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(p)
    msg = str(info.value)
    assert msg.startswith(f"{p}:3: malformed YAML: ")
    assert "\n" not in msg


def test_malformed_yaml_bad_indent(tmp_path: Path):
    p = write(tmp_path, "name: t\ncluster:\n  nodes: 1\n   gpus_per_node: 2\n")
    with pytest.raises(ScenarioError, match=rf"^{p}:4: malformed YAML: mapping values are not allowed here"):
        load_scenario(p)


def test_duplicate_yaml_key(tmp_path: Path):
    p = write(tmp_path, BASE + "seed: 1\nseed: 2\n")
    with pytest.raises(ScenarioError, match=rf"^{p}:7: malformed YAML: duplicate key 'seed'"):
        load_scenario(p)


def test_top_level_not_a_mapping(tmp_path: Path):
    p = write(tmp_path, "- 1\n- 2\n")
    with pytest.raises(ScenarioError, match=rf"^{p}: \(top level\): expected a mapping, got a list$"):
        load_scenario(p)


def test_empty_file(tmp_path: Path):
    p = write(tmp_path, "# nothing here\n")
    with pytest.raises(ScenarioError, match=rf"^{p}: \(top level\): empty scenario; expected a mapping"):
        load_scenario(p)


def test_error_names_the_file_as_given(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples" / "scenarios").mkdir(parents=True)
    text = BASE.replace("train_gpus: [1], infer_gpus: [0, 1]", "train_gpus: [1], infer_gpus: [1, 9]")
    (tmp_path / "examples/scenarios/x.yaml").write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario("examples/scenarios/x.yaml")
    assert str(info.value) == "examples/scenarios/x.yaml: pipelines[1].infer_gpus: GPU 9 outside the cluster (0..7)"
