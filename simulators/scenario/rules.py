"""Field rules for scenario files: the type, bound and unit of every scalar field of
the spec dataclasses (``simulators/scenario/spec.py``). ``simulators/scenario/loader.py`` validates with
this table and checks at import time that it covers every spec field, so a new field
cannot be added to the spec without saying how it is validated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from harness.control.engine import PAUSE_MODES, WAKE_MODES
from simulators.scenario.spec import (
    ClusterSpec,
    CostSpec,
    DataPlaneSpec,
    DisaggregatedSpec,
    FaultSpec,
    ModelSpec,
    PipelineSpec,
    Scenario,
    StreamingSpec,
    WeightSyncGroupsSpec,
    WorkloadSpec,
)


@dataclass(frozen=True)
class Rule:
    kind: str  # "int" | "float" | "str" | "bool"
    bound: str = ""  # "" | ">0" | ">=0" | ">=1" | "(0,1]"
    unit: str = ""  # shown in messages


def _r(kind: str, bound: str = "", unit: str = "") -> Rule:
    return Rule(kind, bound, unit)


FIELD_RULES: Dict[type, Dict[str, Rule]] = {
    ClusterSpec: {
        "nodes": _r("int", ">0", "nodes"),
        "gpus_per_node": _r("int", ">0", "GPUs"),
        "vram_bytes": _r("int", ">0", "bytes per GPU"),
        "host_ram_bytes": _r("int", ">0", "bytes per node"),
        "pcie_bytes_per_s": _r("float", ">0", "bytes/s per GPU and direction"),
        "intra_node_bytes_per_s": _r("float", ">0", "bytes/s"),
        "inter_node_bytes_per_s": _r("float", ">0", "bytes/s per node NIC"),
        "gpu": _r("str", "", "GPU preset"),
    },
    ModelSpec: {
        "params": _r("float", ">0", "parameters"),
        "bytes_per_param": _r("int", ">0", "bytes"),
        "preset": _r("str", "", "model preset"),
        "active_params": _r("float", ">=0", "parameters"),
        "layers": _r("int", ">=0", "layers"),
        "hidden_size": _r("int", ">=0", ""),
        "num_heads": _r("int", ">=0", "heads"),
        "num_kv_heads": _r("int", ">=0", "heads"),
        "head_dim": _r("int", ">=0", ""),
        "vocab_size": _r("int", ">=0", "tokens"),
        "experts_per_token": _r("int", ">=0", "experts"),
        "num_experts": _r("int", ">=0", "experts"),
    },
    WorkloadSpec: {
        "prompts_per_step": _r("int", ">0", "prompt groups"),
        "generations_per_prompt": _r("int", ">0", "generations"),
        "decode_tokens_median": _r("float", ">0", "tokens"),
        "decode_tokens_sigma": _r("float", ">=0", "log-space sigma"),
        "decode_tokens_cap_share": _r("float", ">=0", "share of answers"),
        "decode_tokens_max": _r("int", ">0", "tokens"),
        "max_trajectory_age_steps": _r("int", ">=0", "steps"),
        "max_concurrent_per_rank": _r("int", ">0", "requests"),
        "tokens_per_s_per_rank": _r("float", ">0", "tokens/s"),
        "batching_half_point": _r("float", ">=0", "concurrent requests"),
        "prompt_tokens": _r("int", ">=0", "tokens"),
        "decode_timing": _r("str", "", "at_start or per_step"),
        "decode_expert_read_s": _r("float", ">=0", "s"),
        "decode_kv_s_per_token": _r("float", ">=0", "s per cached token"),
    },
    CostSpec: {
        "train_s_per_trajectory": _r("float", ">=0", "s"),
        "train_fixed_s": _r("float", ">=0", "s"),
        "old_log_probs_s_per_trajectory": _r("float", ">=0", "s"),
        "offload_bytes_per_s": _r("float", ">0", "bytes/s"),
        "train_state_multiplier": _r("float", ">=1", "x weight bytes"),
        "optimizer_state_multiplier": _r("float", ">=0", "x weight bytes"),
        "nccl_group_create_s": _r("float", ">=0", "s"),
        "nccl_group_destroy_s": _r("float", ">=0", "s"),
        "nccl_buffer_bytes": _r("int", ">=0", "bytes"),
        "wake_s": _r("float", ">=0", "s"),
        "sleep_s": _r("float", ">=0", "s"),
        "drain_s": _r("float", ">=0", "s"),
        "finalize_s": _r("float", ">=0", "s"),
        "cache_pack_bytes_per_s": _r("float", ">0", "bytes/s"),
        "bucket_bytes": _r("int", ">0", "bytes"),
        "receiver_load_bytes_per_s": _r("float", ">0", "bytes/s"),
        "refit_pack_bytes_per_s": _r("float", ">=0", "bytes/s (0 = PCIe link)"),
        "refit_group_overhead_s": _r("float", ">=0", "s"),
        "refit_tensor_overhead_s": _r("float", ">=0", "s"),
        "refit_gather_s": _r("float", ">=0", "s per sync"),
        "refit_setup_s": _r("float", ">=0", "s"),
        "refit_staging_bytes_per_s": _r("float", ">=0", "bytes/s (0 = free)"),
        "refit_complete_s": _r("float", ">=0", "s"),
        "kv_cache_fraction": _r("float", "(0,1]", "fraction of free VRAM"),
        "cuda_context_bytes": _r("int", ">=0", "bytes"),
        "train_mfu": _r("float", "(0,1]", ""),
        "moe_train_mfu": _r("float", "(0,1]", ""),
        "moe_decode_flops_efficiency": _r("float", "(0,1]", ""),
        "link_efficiency": _r("float", "(0,1]", ""),
        "decode_flops_efficiency": _r("float", "(0,1]", ""),
        "hbm_efficiency": _r("float", "(0,1]", ""),
        "tp_allreduce_latency_s": _r("float", ">=0", "s"),
        "decode_step_overhead_s": _r("float", ">=0", "s"),
        "max_num_seqs": _r("int", ">0", "sequences"),
        "wake_fixed_s": _r("float", ">=0", "s"),
        "sleep_fixed_s": _r("float", ">=0", "s"),
        "post_sleep_residue_bytes": _r("int", ">=0", "bytes"),
        "post_sleep_threshold_bytes": _r("int", ">0", "bytes"),
        "handover_margin_bytes": _r("int", ">=0", "bytes"),
        "idle_bundle_bound_s": _r("float", ">=0", "s (0 = derived)"),
        "release_to_freed_s": _r("float", ">=0", "s"),
        "offload_wait_timeout_s": _r("float", ">0", "s"),
        "max_residual_gpu_mem_bytes": _r("int", ">=0", "bytes"),
        "watchdog_s": _r("float", ">0", "s"),
        "scheduler_poll_s": _r("float", ">0", "s"),
        "await_release_timeout_s": _r("float", ">0", "s"),
        "resize_lock_timeout_s": _r("float", ">0", "s"),
        "selective_sync_timeout_s": _r("float", ">0", "s"),
        "shrink_drain_timeout_s": _r("float", ">=0", "s; 0 = none"),
    },
    StreamingSpec: {
        "sampler": _r("str"),
        "window": _r("int", ">=0", "versions"),
        "freshest_first": _r("int", ">=0"),
        "custom_target": _r("str"),
        "min_groups_for_streaming_train": _r("int", ">=1", "prompt groups"),
        "max_inflight_prompts": _r("int", ">=1", "prompts"),
        "max_buffered_rollouts": _r("int", ">=1", "prompt groups"),
        "microbatch_groups": _r("int", ">=1", "prompt groups"),
        "infra_failure_rate": _r("float", ">=0", "probability per attempt"),
        "data_failure_rate": _r("float", ">=0", "probability per attempt"),
        "max_infra_attempts_per_prompt": _r("int", ">=1", "attempts"),
        "max_data_attempts_per_prompt": _r("int", ">=1", "attempts"),
        "train_s_per_microbatch": _r("float", ">=0", "s"),
        "watchdog_interval_s": _r("float", ">0", "s"),
        "stall_timeout_s": _r("float", ">0", "s"),
        "stall_action": _r("str"),
        "drop_budgets": _r("bool"),
        "max_skipped_prompts": _r("int", ">=0", "prompts"),
        "max_consecutive_dropped_prompts": _r("int", ">=0", "prompts"),
        "min_step_batch_fraction": _r("float", "(0,1]"),
        "on_dropped_prompt": _r("str"),
        "max_replacement_attempts": _r("int", ">=0", "spare prompts per slot"),
        "replacement_reserve_prompts": _r("int", ">=0", "prompts"),
        "checkpoint_restore_after_steps": _r("int", ">=0", "steps"),
    },
    PipelineSpec: {
        "name": _r("str"),
        "type": _r("str"),
        "infer_tp": _r("int", ">0", "GPUs per DP rank"),
        "train_tp": _r("int", ">0", "GPUs"),
        "train_pp": _r("int", ">0", "stages"),
        "train_cp": _r("int", ">0", "GPUs"),
        "train_ep": _r("int", ">0", "GPUs"),
        "train_micro_batch": _r("int", ">0", "sequences"),
        "train_global_batch": _r("int", ">=0", "sequences"),
        "train_pack_tokens": _r("int", ">=0", "tokens"),
        "log_prob_pack_tokens": _r("int", ">=0", "tokens"),
        "log_prob_passes": _r("int", ">=0", "forward passes"),
        "train_recompute": _r("bool"),
        "train_backend": _r("str"),
        "train_sp": _r("int", ">0", "GPUs per sequence-parallel group"),
        "steps": _r("int", ">0", "training steps"),
        "sleep_level": _r("int"),
        "start_s": _r("float", ">=0", "s"),
        "old_log_probs_offload_states": _r("bool"),
        "offload_nccl": _r("bool"),
        "pause_mode": _r("str"),
        "wake": _r("str"),
        "wait_offloaded": _r("bool"),
        "finalize_pause": _r("str"),
        "weights_memo": _r("bool"),
        "refit_path": _r("str"),
        "refit_export": _r("str"),
        # train_gpus, infer_gpus, model, workload, streaming, data_plane: structured, handled by _pipeline()
    },
    DataPlaneSpec: {
        "route": _r("str"),
        "store_bytes_per_s": _r("float", ">0", "bytes/s"),
        "store_latency_s": _r("float", ">=0", "s per transfer"),
        "driver_bytes_per_s": _r("float", ">0", "bytes/s"),
        "bytes_per_token": _r("int", ">0", "bytes per token"),
        "writeback_bytes_per_token": _r("int", ">=0", "bytes per token"),
        "train_tp": _r("int", ">0", "GPUs per training DP replica"),
    },
    DisaggregatedSpec: {
        "shape": _r("str"),
        "weight_sync": _r("str"),
        "batching": _r("str"),
        "comm_locks": _r("bool"),
    },
    WeightSyncGroupsSpec: {
        "pp_stages": _r("int", ">0", "PP stages"),
        "engines": _r("int", ">0", "rollout engines"),
        "join_order": _r("str"),
        "join_timeout_s": _r("float", ">=0", "s; 0 = none"),
        "receiver_slot": _r("str"),
        "broadcast_timeout_s": _r("float", ">=0", "s; 0 = none"),
        "engine_exits": _r("bool"),
        "rpc_latency_s": _r("float", ">0", "s"),
        "broadcast_s": _r("float", ">0", "s"),
    },
    FaultSpec: {
        "name": _r("str"),
        "pipeline": _r("str"),
        "at_step": _r("int", ">=0", "step"),
    },
    Scenario: {
        "name": _r("str"),
        "description": _r("str"),
        "seed": _r("int", ">=0"),
        "horizon_s": _r("float", ">0", "simulated s"),
        "refit_calibration": _r("str"),
        "step_calibration": _r("str"),
        # cluster, costs, scheduler, pipelines, faults: structured
    },
}


#: engine faults that exist only in some engine mode: fault -> (pipeline field, the values it needs)
_ENGINE_FAULT_NEEDS = {
    "resume_before_kv_wake": ("wake", ("staged",)),
    "kv_wake_before_weights": ("wake", ("staged",)),
    "abort_on_pause": ("pause_mode", ("wait", "keep")),
}

#: faults of the disaggregated fully asynchronous rollouter (simulators/pipelines/disaggregated.py)
_FULLY_ASYNC_FAULTS = ("requeue_ignores_partial_rollout", "staleness_capacity_reset")


#: a pipeline's refit paths (PipelineSpec.refit_path)
REFIT_PATHS = ("cpu_cache", "colocated_ipc")


def refit_path_problem(vals: Dict[str, Any], train: Any, infer: Any, gpu: str) -> Optional[str]:
    """Why a pipeline's ``refit_path`` cannot be taken, or None. The colocated IPC path
    needs a trainer process on every inference GPU (the handles are of the same GPU's
    memory) and the GPU preset's HBM bandwidth (its copies are HBM traffic)."""
    path = vals.get("refit_path", "cpu_cache")
    if path not in REFIT_PATHS:
        return f"must be one of {', '.join(REFIT_PATHS)}, got {path!r}"
    if path != "colocated_ipc":
        return None
    if vals["type"] == "single_controller":
        return "colocated_ipc needs training and inference on the same GPUs (a single_controller is non-colocated)"
    outside = sorted(set(infer) - set(train))
    if outside:
        return f"colocated_ipc needs a trainer on every inference GPU; infer GPUs {outside} are not train_gpus"
    if not gpu:
        return "colocated_ipc needs cluster.gpu (its copies run at the GPU preset's HBM bandwidth)"
    return None


def refit_export_problem(vals: Dict[str, Any]) -> Optional[str]:
    """Why a pipeline's ``refit_export`` (how NeMo RL's refit gathers each tensor whole,
    ``refit_formulas.refit_gather_s``) is not one of the two modelled, or None."""
    from simulators.costmodel.refit_formulas import REFIT_EXPORTS

    export = vals.get("refit_export", "megatron_bridge")
    if export not in REFIT_EXPORTS:
        return f"must be one of {', '.join(REFIT_EXPORTS)}, got {export!r}"
    return None


#: RLix's MILES pause around the active refresh's finalize (harness/control/context.py finalize_pause)
FINALIZE_PAUSES = ("none", "continue_after", "continue_finally")


def engine_field_problem(vals: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """(field, problem) for a pipeline's engine modes (harness/control/engine.py), or None."""
    for key, allowed in (("pause_mode", PAUSE_MODES), ("wake", WAKE_MODES), ("finalize_pause", FINALIZE_PAUSES)):
        if key in vals and vals[key] not in allowed:
            return key, f"must be one of {', '.join(allowed)}, got {vals[key]!r}"
    if vals.get("weights_memo") and vals["type"] not in ("nemo_async", "roll_sync"):
        return "weights_memo", "only a colocated pipeline (nemo_async, roll_sync) releases its engines' weights region"
    for key in ("pause_mode", "wake"):
        if key in vals and vals["type"] == "single_controller":
            return key, (
                "only a colocated pipeline (nemo_async, roll_sync) pauses and wakes its ranks; a "
                "single_controller's engines never sleep"
            )
    return None


def engine_fault_problem(name: str, pipe: Any) -> Optional[str]:
    """Why fault ``name`` cannot fire on pipeline ``pipe`` (its engine mode lacks the step), or None."""
    if name in ("critic_warmup_no_wake", "refit_without_pause") and pipe.type != "single_controller":
        return f"fault {name} needs pipeline {pipe.name} to be single_controller (it is {pipe.type})"
    if name == "comm_locks_inverted" and (pipe.type != "disaggregated" or not pipe.disaggregated.comm_locks):
        return f"fault {name} needs pipeline {pipe.name} to be disaggregated with comm_locks true"
    if name == "memo_not_invalidated" and not pipe.weights_memo:
        return f"fault {name} needs pipeline {pipe.name}'s weights_memo to be true (the engine keeps no memo)"
    if name == "weight_sync_off_thread" and pipe.type != "disaggregated":
        return f"fault {name} needs pipeline {pipe.name} to be disaggregated (it is {pipe.type})"
    if name in _FULLY_ASYNC_FAULTS:
        shape = pipe.disaggregated.shape if pipe.type == "disaggregated" else pipe.type
        if shape != "fully_async":
            return f"fault {name} needs pipeline {pipe.name} to be disaggregated with shape fully_async (it is {shape})"
        if name == "requeue_ignores_partial_rollout" and pipe.disaggregated.weight_sync != "drain":
            return (
                f"fault {name} needs pipeline {pipe.name}'s weight_sync to be drain (partial rollout off; "
                f"it is {pipe.disaggregated.weight_sync})"
            )
        return None
    need = _ENGINE_FAULT_NEEDS.get(name)
    if need is None or getattr(pipe, need[0]) in need[1]:
        return None
    return f"fault {name} needs pipeline {pipe.name}'s {need[0]} to be {' or '.join(need[1])} (it is {getattr(pipe, need[0])})"
