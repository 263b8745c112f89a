"""Scenario fields: every bad value is rejected with one line naming the file, the field
path and the problem (types, bounds, names, faults, topology, cross-field checks)."""

from __future__ import annotations

import pytest

from simulators.scenario.loader import ScenarioError, scenario_from_mapping
from tests.sim.scenario_cases import base


def error_of(data, source: str = "x.yaml") -> str:
    with pytest.raises(ScenarioError) as info:
        scenario_from_mapping(data, source)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_unknown_top_level_key():
    data = base()
    data["sede"] = 1
    assert error_of(data).startswith("x.yaml: sede: unknown field; known: cluster, costs, defaults, description, ")


def test_unknown_nested_key():
    data = base()
    data["pipelines"][0]["model"] = {"param": 1e9}
    assert error_of(data) == (
        "x.yaml: pipelines[0].model.param: unknown field; known: active_params, bytes_per_param, "
        "experts_per_token, head_dim, hidden_size, layers, num_experts, num_heads, num_kv_heads, "
        "params, preset, vocab_size"
    )
    data = base()
    data["cluster"]["gpus"] = 8
    assert error_of(data).startswith("x.yaml: cluster.gpus: unknown field; known: gpu, gpus_per_node, ")
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
    assert (
        error_of(data)
        == "x.yaml: pipelines[1].type: unknown pipeline type 'nemo_sync'; known: nemo_async, roll_sync, single_controller, disaggregated"
    )


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
        "no_gen_estimate, expand_sync_fails, lost_finish, stale_select_target, sync_outside_expand, bulk_in_driver_meta, "
        "stale_batch, no_host_ram_guard, unchecked_activation, sleep_residue_grows, staging_leak, refit_slows, "
        "unclamped_base_stamp, lost_lock_handoff, partial_reload, resume_before_kv_wake, kv_wake_before_weights, "
        "abort_on_pause, stamp_at_completion, active_sync_fails, lost_cache_handoff, lost_release_ack, "
        "watchdog_request_under_lock, double_onload, finalize_fails, requeue_ignores_partial_rollout, "
        "staleness_capacity_reset, weight_sync_off_thread, critic_warmup_no_wake, publish_on_ack, "
        "refit_without_pause, memo_not_invalidated, comm_locks_inverted"
    )


def test_fault_memo_not_invalidated_needs_the_weights_memo():
    data = base()
    data["faults"] = [{"name": "memo_not_invalidated", "pipeline": "ppl1"}]
    assert "weights_memo to be true" in error_of(data)


@pytest.mark.parametrize(
    "fault, problem",
    [
        (
            "critic_warmup_no_wake",
            "fault critic_warmup_no_wake needs pipeline ppl1 to be single_controller (it is nemo_async)",
        ),
        (
            "weight_sync_off_thread",
            "fault weight_sync_off_thread needs pipeline ppl1 to be disaggregated (it is nemo_async)",
        ),
        (
            "staleness_capacity_reset",
            "fault staleness_capacity_reset needs pipeline ppl1 to be disaggregated with shape fully_async (it is nemo_async)",
        ),
    ],
)
def test_a_fault_on_a_pipeline_that_cannot_fire_it_is_refused(fault, problem):
    data = base()
    data["faults"] = [{"name": fault, "pipeline": "ppl1"}]
    assert error_of(data) == f"x.yaml: faults[0].name: {problem}"


def test_engine_modes_are_checked_by_name():
    data = base()
    data["pipelines"][0]["pause_mode"] = "retract"
    assert error_of(data) == "x.yaml: pipelines[0].pause_mode: must be one of abort, wait, keep, got 'retract'"
    data = base()
    data["pipelines"][0]["wake"] = "kv_first"
    assert error_of(data) == "x.yaml: pipelines[0].wake: must be one of all, staged, got 'kv_first'"
    data = base()
    data["faults"] = [{"name": "resume_before_kv_wake", "pipeline": "ppl1"}]
    assert error_of(data) == (
        "x.yaml: faults[0].name: fault resume_before_kv_wake needs pipeline ppl1's wake to be staged (it is all)"
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


TOPOLOGY_ERRORS = {
    "duplicate_gpu": (
        {"infer_gpus": [0, 1, 1]},
        {},
        "pipelines[0].infer_gpus: device_mapping lists GPU(s) [1] more than once (rule: duplicate_gpu)",
    ),
    "tp_not_dividing": (
        {"infer_gpus": [0, 1, 2], "infer_tp": 2},
        {},
        "pipelines[0].infer_gpus: len(device_mapping)=3 is not divisible by tp_size=2 (rule: tp_divides)",
    ),
    "tp_not_contiguous": (
        {"infer_gpus": [0, 1, 3, 5], "infer_tp": 2},
        {},
        "pipelines[0].infer_gpus: TP group [3, 5] is not contiguous (rule: tp_contiguous)",
    ),
    "tp_crosses_node": (
        {"train_gpus": [0], "infer_gpus": [0, 1, 2, 3], "infer_tp": 2},
        {"nodes": 2, "gpus_per_node": 3},
        "pipelines[0].infer_gpus: TP group [2, 3] crosses a node boundary (gpus_per_node=3) (rule: tp_node)",
    ),
    "bad_tp_size": (
        {"infer_gpus": [0, 1, 2], "infer_tp": 3},
        {},
        "pipelines[0].infer_tp: tp_size=3 must be 1, 2, 4, 8 or a multiple of gpus_per_node=8 (rule: tp_size)",
    ),
}


@pytest.mark.parametrize("case", sorted(TOPOLOGY_ERRORS))
def test_topology_rule_errors_name_the_field_and_the_rule(case):
    pipeline_fields, cluster, message = TOPOLOGY_ERRORS[case]
    data = base()
    if cluster:
        data["cluster"] = cluster
    data["pipelines"][0].update(pipeline_fields)
    assert error_of(data) == f"x.yaml: {message}"


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
    assert (
        error_of(data)
        == "x.yaml: pipelines[0].infer_gpus: partial overlap needs infer dp >= 2, got 1 (rule: overlap_infer_dp)"
    )


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


def test_workload_cap_share_is_a_share():
    data = base()
    data["defaults"] = {"workload": {"decode_tokens_cap_share": 1}}
    assert error_of(data) == (
        "x.yaml: pipelines[0].workload.decode_tokens_cap_share: must be below 1 (a share of the answers), got 1"
    )
    data["defaults"] = {"workload": {"decode_tokens_cap_share": -0.1}}
    assert (
        error_of(data) == "x.yaml: defaults.workload.decode_tokens_cap_share: must be >= 0 (share of answers), got -0.1"
    )


def test_weights_memo_is_a_colocated_pipelines_option():
    data = base()
    data["pipelines"][0]["weights_memo"] = "yes"
    assert "weights_memo" in error_of(data)
    data["pipelines"][0].update(type="single_controller", weights_memo=True)
    assert "pipelines[0].weights_memo: only a colocated pipeline" in error_of(data)


def test_comm_locks_are_one_step_offs_and_their_fault_needs_them():
    data = base()
    data["pipelines"] = [
        {
            "name": "g",
            "type": "disaggregated",
            "train_gpus": [0],
            "infer_gpus": [1],
            "disaggregated": {"comm_locks": True},
        }
    ]
    assert "pipelines[0].disaggregated.comm_locks: only one_step_off" in error_of(data)
    data["pipelines"][0]["disaggregated"] = {"shape": "one_step_off"}
    data["faults"] = [{"name": "comm_locks_inverted", "pipeline": "g"}]
    assert "needs pipeline g to be disaggregated with comm_locks true" in error_of(data)
