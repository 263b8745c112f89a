"""Scenario files: every example loads, errors are one line naming file, field and problem."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
import yaml

from simulators.scenario import (
    FIELD_RULES,
    ScenarioError,
    load_scenario,
    scenario_from_mapping,
)
from simulators.scenario_dump import scenario_to_mapping
from simulators.spec import (
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

BASE = """\
name: t
cluster: {nodes: 1, gpus_per_node: 8}
pipelines:
  - {name: ppl1, type: nemo_async, train_gpus: [0], infer_gpus: [0, 1]}
  - {name: ppl2, type: nemo_async, train_gpus: [1], infer_gpus: [0, 1]}
"""


def base() -> dict:
    return yaml.safe_load(BASE)


def write(tmp_path: Path, text: str, name: str = "x.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def error_of(data, source: str = "x.yaml") -> str:
    with pytest.raises(ScenarioError) as info:
        scenario_from_mapping(data, source)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


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
            PipelineSpec("a", "roll_sync", (0, 1), (0, 1, 2, 3), infer_tp=2, steps=3, sleep_level=1, start_s=2.5,
                         model=ModelSpec(params=7e9, bytes_per_param=1),
                         workload=WorkloadSpec(prompts_per_step=3, decode_tokens_sigma=0.0)),
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
    data["defaults"] = {"model": {"params": 1.5e9, "bytes_per_param": 4}, "workload": {"prompts_per_step": 16, "decode_tokens_max": 2048}}
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
    p = write(tmp_path, BASE + "horizon_s: 100\ncosts: {offload_bytes_per_s: 20e9, wake_s: 1}\n"
              "defaults: {model: {params: 5e8}}\n")
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


# ---------------------------------------------------------------- field errors


def test_unknown_top_level_key():
    data = base()
    data["sede"] = 1
    assert error_of(data).startswith("x.yaml: sede: unknown field; known: cluster, costs, defaults, description, ")


def test_unknown_nested_key():
    data = base()
    data["pipelines"][0]["model"] = {"param": 1e9}
    assert error_of(data) == "x.yaml: pipelines[0].model.param: unknown field; known: bytes_per_param, params"
    data = base()
    data["cluster"]["gpus"] = 8
    assert error_of(data).startswith("x.yaml: cluster.gpus: unknown field; known: gpus_per_node, ")
    data = base()
    data["defaults"] = {"costs": {}}
    assert error_of(data) == "x.yaml: defaults.costs: unknown field; known: model, streaming, workload"


def test_missing_required():
    data = base()
    del data["cluster"]
    assert error_of(data) == "x.yaml: cluster: missing (required)"
    data = base()
    del data["pipelines"][1]["type"]
    assert error_of(data) == "x.yaml: pipelines[1].type: missing (required)"
    data = base()
    data["faults"] = [{"pipeline": "ppl1"}]
    assert error_of(data) == "x.yaml: faults[0].name: missing (required)"


def test_bool_is_not_an_int():
    data = base()
    data["pipelines"][0]["steps"] = True
    assert error_of(data) == "x.yaml: pipelines[0].steps: expected an integer (training steps), got boolean true"


def test_float_is_not_an_int():
    data = base()
    data["cluster"]["vram_bytes"] = 80e9
    assert error_of(data) == "x.yaml: cluster.vram_bytes: expected an integer (bytes per GPU), got 80000000000.0"


def test_wrong_type_string_for_number():
    data = base()
    data["costs"] = {"wake_s": "fast"}
    assert error_of(data) == "x.yaml: costs.wake_s: expected a number (s), got string 'fast'"
    data = base()
    data["pipelines"][0]["train_gpus"] = [0, "1"]
    assert error_of(data) == "x.yaml: pipelines[0].train_gpus[1]: expected an integer GPU id, got string '1'"
    data = base()
    data["pipelines"] = {"ppl1": {}}
    assert error_of(data) == "x.yaml: pipelines: expected a list of pipelines, got a mapping"


def test_non_positive_size_count_bandwidth():
    data = base()
    data["cluster"]["vram_bytes"] = 0
    assert error_of(data) == "x.yaml: cluster.vram_bytes: must be > 0 (bytes per GPU), got 0"
    data = base()
    data["cluster"]["inter_node_bytes_per_s"] = -1
    assert error_of(data) == "x.yaml: cluster.inter_node_bytes_per_s: must be > 0 (bytes/s per node NIC), got -1"
    data = base()
    data["pipelines"][1]["workload"] = {"prompts_per_step": 0}
    assert error_of(data) == "x.yaml: pipelines[1].workload.prompts_per_step: must be > 0 (prompt groups), got 0"
    data = base()
    data["defaults"] = {"model": {"params": -5}}
    assert error_of(data) == "x.yaml: defaults.model.params: must be > 0 (parameters), got -5"


def test_negative_time():
    data = base()
    data["costs"] = {"wake_s": -0.5}
    assert error_of(data) == "x.yaml: costs.wake_s: must be >= 0 (s), got -0.5"
    data = base()
    data["pipelines"][0]["start_s"] = -1
    assert error_of(data) == "x.yaml: pipelines[0].start_s: must be >= 0 (s), got -1"
    data = base()
    data["horizon_s"] = 0
    assert error_of(data) == "x.yaml: horizon_s: must be > 0 (simulated s), got 0"


def test_non_finite_number():
    data = base()
    data["costs"] = {"drain_s": float("nan")}
    assert error_of(data) == "x.yaml: costs.drain_s: must be a finite number (s), got nan"


def test_fraction_out_of_range():
    data = base()
    data["costs"] = {"kv_cache_fraction": 1.5}
    assert error_of(data) == "x.yaml: costs.kv_cache_fraction: must be in (0, 1] (fraction of free VRAM), got 1.5"


def test_sleep_level():
    data = base()
    data["pipelines"][0]["sleep_level"] = 3
    assert error_of(data) == (
        "x.yaml: pipelines[0].sleep_level: must be 1 (weights kept in host RAM) or 2 (weights dropped), got 3"
    )


def test_unknown_pipeline_type():
    data = base()
    data["pipelines"][1]["type"] = "nemo_sync"
    assert error_of(data) == "x.yaml: pipelines[1].type: unknown pipeline type 'nemo_sync'; known: nemo_async, roll_sync, single_controller"


def test_duplicate_pipeline_name():
    data = base()
    data["pipelines"][1]["name"] = "ppl1"
    assert error_of(data) == "x.yaml: pipelines[1].name: duplicate pipeline name 'ppl1' (also pipelines[0])"


def test_bad_pipeline_name():
    data = base()
    data["pipelines"][0]["name"] = "ppl:1"
    assert error_of(data) == "x.yaml: pipelines[0].name: pipeline_id must not contain ':'"


def test_fault_unknown_pipeline():
    data = base()
    data["faults"] = [{"name": "wake_before_offload", "pipeline": "ppl9", "at_step": 1}]
    assert error_of(data) == "x.yaml: faults[0].pipeline: unknown pipeline 'ppl9'; known: ppl1, ppl2"


def test_fault_unknown_name():
    data = base()
    data["faults"] = [{"name": "explode", "pipeline": "ppl1"}]
    assert error_of(data) == (
        "x.yaml: faults[0].name: unknown fault 'explode'; known: "
        "wake_before_offload, skip_sync_on_expand, keep_nccl_on_sleep, noop_progress_hooks, no_gen_watchdog, keep_gen_on_finish, cache_after_offload, abort_never_wakes, "
        "collector_dies, engines_crash_after_refit, stuck_request, offload_keeps_params, strand_sync_group, "
        "no_gen_estimate, expand_sync_fails, lost_finish"
    )


def test_fault_step_never_reached():
    data = base()
    data["faults"] = [{"name": "wake_before_offload", "pipeline": "ppl1", "at_step": 4}]
    assert error_of(data) == "x.yaml: faults[0].at_step: step 4 is never reached: pipeline ppl1 runs steps 0..3"


def test_gpu_outside_cluster():
    data = base()
    data["pipelines"][1]["infer_gpus"] = [0, 1, 9]
    assert error_of(data, "examples/scenarios/x.yaml") == (
        "examples/scenarios/x.yaml: pipelines[1].infer_gpus: GPU 9 outside the cluster (0..7)"
    )
    data = base()
    data["pipelines"][0]["train_gpus"] = [-1, 8]
    assert error_of(data) == "x.yaml: pipelines[0].train_gpus: GPUs -1, 8 outside the cluster (0..7)"


def test_empty_gpu_list():
    data = base()
    data["pipelines"][0]["train_gpus"] = []
    assert error_of(data) == "x.yaml: pipelines[0].train_gpus: must list at least one GPU"


def test_topology_duplicate_gpu():
    data = base()
    data["pipelines"][0]["infer_gpus"] = [0, 1, 1]
    assert error_of(data) == (
        "x.yaml: pipelines[0].infer_gpus: device_mapping lists GPU(s) [1] more than once (rule: duplicate_gpu)"
    )


def test_topology_tp_not_dividing():
    data = base()
    data["pipelines"][0].update(infer_gpus=[0, 1, 2], infer_tp=2)
    assert error_of(data) == (
        "x.yaml: pipelines[0].infer_gpus: len(device_mapping)=3 is not divisible by tp_size=2 (rule: tp_divides)"
    )


def test_topology_tp_not_contiguous():
    data = base()
    data["pipelines"][0].update(infer_gpus=[0, 1, 3, 5], infer_tp=2)
    assert error_of(data) == "x.yaml: pipelines[0].infer_gpus: TP group [3, 5] is not contiguous (rule: tp_contiguous)"


def test_topology_tp_crosses_node():
    data = base()
    data["cluster"] = {"nodes": 2, "gpus_per_node": 3}
    data["pipelines"][0].update(train_gpus=[0], infer_gpus=[0, 1, 2, 3], infer_tp=2)
    assert error_of(data) == (
        "x.yaml: pipelines[0].infer_gpus: TP group [2, 3] crosses a node boundary (gpus_per_node=3) (rule: tp_node)"
    )


def test_topology_bad_tp_size():
    data = base()
    data["pipelines"][0].update(infer_gpus=[0, 1, 2], infer_tp=3)
    assert error_of(data) == (
        "x.yaml: pipelines[0].infer_tp: tp_size=3 must be 1, 2, 4, 8 or a multiple of gpus_per_node=8 (rule: tp_size)"
    )


def test_nemo_async_partial_overlap_subset():
    data = base()
    data["pipelines"][0]["train_gpus"] = [2]
    assert error_of(data) == (
        "x.yaml: pipelines[0].train_gpus: train GPUs [2] are not in actor_infer's mapping "
        "(train must be a subset of infer) (rule: overlap_subset)"
    )


def test_nemo_async_partial_overlap_dp():
    data = base()
    data["pipelines"][0].update(train_gpus=[0], infer_gpus=[0])
    assert error_of(data) == "x.yaml: pipelines[0].infer_gpus: partial overlap needs infer dp >= 2, got 1 (rule: overlap_infer_dp)"


def test_nemo_async_partial_overlap_survivor():
    data = base()
    data["pipelines"][0].update(train_gpus=[0, 1], infer_gpus=[0, 1])
    assert error_of(data) == (
        "x.yaml: pipelines[0].infer_gpus: only 0 infer GPU(s) outside training; at least one full DP rank "
        "(1 GPUs) must keep serving while training (rule: overlap_survivor)"
    )


def test_roll_sync_train_subset_of_infer():
    data = base()
    data["pipelines"][0].update(type="roll_sync", train_gpus=[0, 2], infer_gpus=[0, 1])
    assert error_of(data) == (
        "x.yaml: pipelines[0].train_gpus: train GPUs [2] are not in infer_gpus (roll_sync needs train ⊆ infer)"
    )
    # all-overlap is fine for ROLL (the whole GEN cluster shrinks every step)
    data["pipelines"][0].update(train_gpus=[0, 1])
    assert scenario_from_mapping(data, "x.yaml").pipelines[0].train_gpus == (0, 1)


def test_scheduler_options():
    data = base()
    data["scheduler"] = {"head_of_line_blocking": "yes"}
    assert error_of(data) == (
        "x.yaml: scheduler.head_of_line_blocking: scheduler option 'head_of_line_blocking' must be true or false, got 'yes'"
    )
    data["scheduler"] = {"hol": True}
    assert error_of(data).startswith("x.yaml: scheduler.hol: unknown field; known: ack_unplanned_releases, ")
    data["scheduler"] = {"epsilon": 1, "head_of_line_blocking": True}
    s = scenario_from_mapping(data, "x.yaml")
    assert s.scheduler == {"epsilon": 1.0, "head_of_line_blocking": True}


def test_start_after_horizon():
    data = base()
    data["horizon_s"] = 10
    data["pipelines"][1]["start_s"] = 10
    assert error_of(data) == "x.yaml: pipelines[1].start_s: 10 s is not before horizon_s 10 s"


def test_workload_median_above_max():
    data = base()
    data["defaults"] = {"workload": {"decode_tokens_max": 256}}
    assert error_of(data) == (
        "x.yaml: pipelines[0].workload.decode_tokens_median: median 512 tokens exceeds decode_tokens_max 256 tokens"
    )
