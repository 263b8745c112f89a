"""NeMo RL GRPO configs (``examples/configs/*.yaml`` and their recipes) -> one pipeline.

The config is read as NeMo RL's ``nemo_rl/utils/config.py`` reads it: ``defaults:`` (a
file or a list, relative to the file, parents merged depth-first, later wins, a section
marked ``_override_: true`` replaces the parent's) and then Hydra-style overrides. The
translation (every rule is a comment in the written scenario):

* ``async_rl`` set -> ``single_controller`` (``nemo_rl/algorithms/single_controller.py``);
  ``grpo.async_grpo.enabled`` -> ``nemo_async``; otherwise synchronous GRPO, whose step
  (generate, log-probs, train, refit) is ``roll_sync``'s step order;
* ``policy.generation.colocated.enabled`` -> training and inference on every GPU with the
  colocated CUDA-IPC refit at vLLM sleep level 1 (standalone NeMo RL); non-colocated -> the
  last ``colocated.resources`` GPUs/nodes generate, the rest train;
* Megatron's or DTensor's TP/PP/CP/EP, micro and global batch, activation checkpointing,
  the reference-policy pass, vLLM's TP and ``gpu_memory_utilization``.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from simulators.config_import.common import (
    ConfigRefused,
    apply_overrides,
    get,
    load_yaml,
    merge,
    model_preset,
    scenario_name,
    start_draft,
    typed,
)
from simulators.config_import.draft import ScenarioDraft

#: (key, what it does that a scenario cannot hold) — the first one set refuses the config
_UNSUPPORTED = (
    ("policy.dtensor_cfg.lora_cfg.enabled", "LoRA trains adapters, not the full training state the model charges"),
    ("policy.megatron_cfg.peft.enabled", "PEFT trains adapters, not the full training state the model charges"),
    ("policy.dtensor_cfg.cpu_offload", "training state offloaded to host memory between passes is not modelled"),
    ("policy.megatron_cfg.optimizer.optimizer_cpu_offload", "an optimizer held in host memory is not modelled"),
    ("data_plane.enabled", "the TransferQueue data plane's placement is not derived from a NeMo RL config"),
    ("policy.draft.enabled", "a speculative-decoding draft model is not modelled"),
)

_SAMPLER_WINDOW_KEYS = ("max_lookahead_versions", "max_staleness_versions")
_SAMPLERS = ("in_order", "weight_fifo", "windowed", "ready_first")
_MAX_DEPTH = 16


def load(path: str, overrides: Sequence[str] = ()) -> Tuple[Dict[str, Any], List[str]]:
    """The resolved config and the files it inherits from (nearest first)."""
    chain: List[str] = []
    cfg = _load_inherited(path, os.path.dirname(os.path.abspath(path)), chain, 0)
    apply_overrides(cfg, overrides)
    return cfg, chain


def _load_inherited(path: str, base_dir: str, chain: List[str], depth: int) -> Dict[str, Any]:
    if depth > _MAX_DEPTH:
        raise ConfigRefused("defaults", f"inheritance deeper than {_MAX_DEPTH} files (a cycle?) at {path}")
    cfg = load_yaml(path, "defaults" if depth else "(file)")
    if "defaults" not in cfg:
        return cfg
    parents = cfg.pop("defaults")
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(x, str) for x in parents):
        raise ConfigRefused("defaults", f"expected a file name or a list of them, got {parents!r}")
    base: Dict[str, Any] = {}
    for parent in parents:
        parent_path = parent if os.path.isabs(parent) else os.path.normpath(os.path.join(base_dir, parent))
        if not os.path.isfile(parent_path):
            raise ConfigRefused("defaults", f"{parent!r} (in {os.path.basename(path)}): no such file next to it")
        chain.append(os.path.basename(parent_path))
        base = merge(base, _load_inherited(parent_path, os.path.dirname(parent_path), chain, depth + 1))
    return merge(base, cfg)


def _refuse_unsupported(cfg: Dict[str, Any]) -> None:
    if not isinstance(get(cfg, "grpo", None), dict):
        kinds = {
            "sft": "an SFT",
            "dpo": "a DPO",
            "rm": "a reward-model",
            "distillation": "a distillation",
            "eval": "an evaluation",
            "ppo": "a PPO",
        }
        kind = next((v for k, v in kinds.items() if k in cfg), None)
        raise ConfigRefused(
            "grpo",
            "absent: not a GRPO config"
            + (f" ({kind} config)" if kind else "")
            + "; only RL training with rollouts is simulated",
        )
    if get(cfg, "on_policy_distillation", None):
        raise ConfigRefused("on_policy_distillation", "teacher models served beside the policy are not modelled")
    if isinstance(get(cfg, "value", None), dict) or isinstance(get(cfg, "ppo", None), dict):
        raise ConfigRefused("value" if "value" in cfg else "ppo", "a critic model is not modelled (GRPO-style only)")
    backend = get(cfg, "policy.generation.backend", "vllm")
    if backend != "vllm":
        raise ConfigRefused("policy.generation.backend", f"{backend!r}: only vLLM generation is modelled")
    turns = get(cfg, "grpo.max_rollout_turns", 1)
    if isinstance(turns, int) and turns > 1:
        raise ConfigRefused(
            "grpo.max_rollout_turns", f"{turns}: multi-turn rollouts are not modelled (one decode each)"
        )
    sc = isinstance(get(cfg, "async_rl", None), dict)
    for key, why in _UNSUPPORTED:
        if key == "data_plane.enabled" and sc:
            continue  # the single controller's rollout buffer is its streaming section
        if get(cfg, key, False) is True:
            raise ConfigRefused(key, f"true: {why}")
    for key in ("policy.generation.vllm_cfg.pipeline_parallel_size", "policy.generation.vllm_cfg.expert_parallel_size"):
        n = get(cfg, key, 1)
        if isinstance(n, int) and n > 1:
            raise ConfigRefused(key, f"{n}: an inference rank is a tensor-parallel bundle only")
    vprec = str(get(cfg, "policy.generation.vllm_cfg.precision", "bfloat16"))
    if "fp8" in vprec or get(cfg, "policy.megatron_cfg.fp8_cfg.enabled", False) is True:
        key = "policy.generation.vllm_cfg.precision" if "fp8" in vprec else "policy.megatron_cfg.fp8_cfg.enabled"
        raise ConfigRefused(key, "FP8: the model holds one weight size for training and inference")


def _bytes_per_param(cfg: Dict[str, Any]) -> Tuple[int, str]:
    prec = str(get(cfg, "policy.precision", "bfloat16"))
    sizes = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4, "fp32": 4}
    if prec not in sizes:
        raise ConfigRefused("policy.precision", f"{prec!r}: expected bfloat16, float16 or float32")
    return sizes[prec], f"policy.precision = {prec}"


def _layout(cfg: Dict[str, Any], sc: bool) -> Tuple[List[int], List[int], int, int, str]:
    """(train GPUs, inference GPUs, nodes, GPUs per node, how) from ``cluster`` and ``colocated``."""
    nodes = typed(cfg, "cluster.num_nodes", int)
    gpn = typed(cfg, "cluster.gpus_per_node", int)
    if nodes < 1 or gpn < 1:
        raise ConfigRefused("cluster.num_nodes" if nodes < 1 else "cluster.gpus_per_node", "must be >= 1")
    total = nodes * gpn
    if get(cfg, "policy.generation.colocated.enabled", True) is True:
        if sc:
            raise ConfigRefused(
                "policy.generation.colocated.enabled",
                "true with async_rl: the colocated single controller is not modelled (its GPUs "
                "are modelled as its own, non-colocated)",
            )
        return list(range(total)), list(range(total)), nodes, gpn, "policy.generation.colocated.enabled = true"
    if not sc:
        raise ConfigRefused(
            "policy.generation.colocated.enabled",
            "false: RLix's scheduler needs every training GPU among the inference GPUs (train ⊆ infer); "
            "a non-colocated layout is modelled for the single controller (async_rl) only",
        )
    res_nodes = get(cfg, "policy.generation.colocated.resources.num_nodes", None)
    res_gpn = get(cfg, "policy.generation.colocated.resources.gpus_per_node", None)
    if nodes == 1:
        if not isinstance(res_gpn, int) or not 0 < res_gpn < gpn:
            raise ConfigRefused(
                "policy.generation.colocated.resources.gpus_per_node",
                f"{res_gpn!r}: on one node, the GPUs that generate (1..{gpn - 1})",
            )
        n_infer, how = res_gpn, f"the last policy.generation.colocated.resources.gpus_per_node = {res_gpn} GPUs"
    else:
        if not isinstance(res_nodes, int) or not 0 < res_nodes < nodes:
            raise ConfigRefused(
                "policy.generation.colocated.resources.num_nodes",
                f"{res_nodes!r}: the nodes that generate (1..{nodes - 1})",
            )
        n_infer, how = res_nodes * gpn, f"the last policy.generation.colocated.resources.num_nodes = {res_nodes} nodes"
    return list(range(total - n_infer)), list(range(total - n_infer, total)), nodes, gpn, how


def translate(
    cfg: Dict[str, Any], source: str, chain: Sequence[str], *, gpu: str, steps: int, name: Optional[str] = None
) -> ScenarioDraft:
    _refuse_unsupported(cfg)
    train, infer, nodes, gpn, how = _layout(cfg, isinstance(get(cfg, "async_rl", None), dict))
    name = name or scenario_name(source)
    d = start_draft(
        "the NeMo RL config",
        "nemo-rl-config",
        os.path.basename(source),
        chain,
        name,
        (typed(cfg, "grpo.seed", int, 0), "grpo.seed"),
    )
    d.set(("cluster", "nodes"), nodes, "cluster.num_nodes")
    d.set(("cluster", "gpus_per_node"), gpn, "cluster.gpus_per_node")
    d.set(("cluster", "gpu"), gpu, "--gpu (a NeMo RL config names no GPU type)")
    add_pipeline(
        d,
        0,
        cfg,
        name,
        train,
        infer,
        steps,
        layout=(
            f"cluster.num_nodes x cluster.gpus_per_node = {nodes} x {gpn} GPUs; "
            + (how if train == infer else f"all but {how}"),
            how if train != infer else f"{how}: every GPU generates",
        ),
    )
    return d


def add_pipeline(
    d: ScenarioDraft,
    index: int,
    cfg: Dict[str, Any],
    name: str,
    train: List[int],
    infer: List[int],
    steps: int,
    layout: Tuple[str, str],
    rlix: Optional[Dict[str, str]] = None,
) -> None:
    """Pipeline ``index`` of the draft from the (loaded) NeMo RL config ``cfg`` on the given
    GPUs; ``layout`` is where the two GPU lists came from. ``rlix`` (sleep_level's source)
    when RLix drives the pipeline: its refit and sleep level then stay RLix's."""
    sc = isinstance(get(cfg, "async_rl", None), dict)
    p = ("pipelines", index)
    d.set(p + ("name",), re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64], "the config's name")
    colocated = train == infer and rlix is None
    if sc:
        if rlix is not None:
            raise ConfigRefused("async_rl", "the single controller is not an RLix pipeline")
        d.set(p + ("type",), "single_controller", "async_rl is set: NeMo RL's single controller")
    elif get(cfg, "grpo.async_grpo.enabled", False) is True:
        d.set(p + ("type",), "nemo_async", "grpo.async_grpo.enabled = true")
    else:
        d.set(
            p + ("type",),
            "roll_sync",
            "grpo.async_grpo.enabled = false: synchronous GRPO (generate, log-probs, "
            "train, refit: roll_sync's step order)",
        )
    d.set(p + ("train_gpus",), train, layout[0])
    d.set(p + ("infer_gpus",), infer, layout[1])
    d.set(
        p + ("infer_tp",),
        typed(cfg, "policy.generation.vllm_cfg.tensor_parallel_size", int, 1),
        "policy.generation.vllm_cfg.tensor_parallel_size",
    )
    _training(d, p, cfg)
    bpp, bsrc = _bytes_per_param(cfg)
    d.set(
        p + ("model", "preset"), model_preset(get(cfg, "policy.model_name"), "policy.model_name"), "policy.model_name"
    )
    d.set(p + ("model", "bytes_per_param"), bpp, bsrc)
    d.set(
        p + ("steps",), steps, f"--steps (the config runs grpo.max_num_steps = {get(cfg, 'grpo.max_num_steps', '?')})"
    )
    if colocated:
        d.set(p + ("refit_path",), "colocated_ipc", "policy.generation.colocated.enabled = true: CUDA-IPC refit")
        d.set(
            p + ("sleep_level",), 1, "policy.generation.colocated.enabled = true: standalone NeMo RL sleeps at level 1"
        )
    elif rlix and "sleep_level" in rlix:
        d.set(p + ("sleep_level",), int(rlix["sleep_level"]), "actor_infer.strategy_args.strategy_config.sleep_level")
    _workload(d, p, cfg, sc)
    util = get(cfg, "policy.generation.vllm_cfg.gpu_memory_utilization", None)
    if isinstance(util, (int, float)):
        d.set(p + ("costs", "kv_cache_fraction"), util, "policy.generation.vllm_cfg.gpu_memory_utilization")
    seqs = get(cfg, "policy.generation.vllm_kwargs.max_num_seqs", None)
    if isinstance(seqs, int):
        d.set(("costs", "max_num_seqs"), seqs, "policy.generation.vllm_kwargs.max_num_seqs")
    if sc:
        _streaming(d, p, cfg)


def _training(d: ScenarioDraft, p: Tuple[Any, ...], cfg: Dict[str, Any]) -> None:
    if get(cfg, "policy.megatron_cfg.enabled", False) is True:
        m = "policy.megatron_cfg."
        for field, key in (
            ("train_tp", "tensor_model_parallel_size"),
            ("train_pp", "pipeline_model_parallel_size"),
            ("train_cp", "context_parallel_size"),
            ("train_ep", "expert_model_parallel_size"),
        ):
            d.set(p + (field,), typed(cfg, m + key, int, 1), m + key)
        d.set(
            p + ("train_recompute",),
            get(cfg, m + "activation_checkpointing", False) is True,
            m + "activation_checkpointing",
        )
    else:
        m = "policy.dtensor_cfg."
        d.set(p + ("train_tp",), typed(cfg, m + "tensor_parallel_size", int, 1), m + "tensor_parallel_size")
        d.set(p + ("train_cp",), typed(cfg, m + "context_parallel_size", int, 1), m + "context_parallel_size")
        d.set(
            p + ("train_recompute",),
            get(cfg, m + "activation_checkpointing", False) is True,
            m + "activation_checkpointing",
        )
    d.set(p + ("train_micro_batch",), typed(cfg, "policy.train_micro_batch_size", int), "policy.train_micro_batch_size")
    d.set(
        p + ("train_global_batch",), typed(cfg, "policy.train_global_batch_size", int), "policy.train_global_batch_size"
    )
    kl = get(cfg, "loss_fn.reference_policy_kl_penalty", 0) or 0
    d.set(
        p + ("log_prob_passes",),
        2 if kl > 0 else 1,
        f"loss_fn.reference_policy_kl_penalty = {kl}: "
        + ("the reference policy's pass too" if kl > 0 else "policy only"),
    )


def _workload(d: ScenarioDraft, p: Tuple[Any, ...], cfg: Dict[str, Any], sc: bool) -> None:
    w = p + ("workload",)
    prompts = typed(cfg, "grpo.num_prompts_per_step", int)
    if get(cfg, "grpo.use_dynamic_sampling", False) is True:
        mult = typed(cfg, "grpo.batch_multiplier", int, 1)
        d.set(
            w + ("prompts_per_step",),
            prompts * mult,
            f"grpo.num_prompts_per_step x grpo.batch_multiplier = {prompts} x {mult} (grpo.use_dynamic_sampling: one "
            f"generation batch; up to grpo.dynamic_sampling_max_gen_batches per step)",
        )
    else:
        d.set(w + ("prompts_per_step",), prompts, "grpo.num_prompts_per_step")
    d.set(
        w + ("generations_per_prompt",),
        typed(cfg, "grpo.num_generations_per_prompt", int),
        "grpo.num_generations_per_prompt",
    )
    total = typed(cfg, "policy.max_total_sequence_length", int)
    new = typed(cfg, "policy.generation.max_new_tokens", int, total)
    cap = min(new, total)
    d.set(w + ("decode_tokens_max",), cap, "min(policy.generation.max_new_tokens, policy.max_total_sequence_length)")
    d.set(
        w + ("decode_tokens_median",),
        min(512, max(1, cap // 2)),
        "not in the config (the dataset's answers): the workload's 512 tokens, at most half of decode_tokens_max",
    )
    d.set(
        w + ("prompt_tokens",),
        min(256, max(0, total - cap)) if total > cap else min(256, total // 4),
        "not in the config (the dataset's prompts): 256 tokens at most, within policy.max_total_sequence_length "
        "beside decode_tokens_max",
    )
    if not sc and get(cfg, "grpo.async_grpo.enabled", False) is True:
        d.set(
            w + ("max_trajectory_age_steps",),
            typed(cfg, "grpo.async_grpo.max_trajectory_age_steps", int, 1),
            "grpo.async_grpo.max_trajectory_age_steps",
        )


def _streaming(d: ScenarioDraft, p: Tuple[Any, ...], cfg: Dict[str, Any]) -> None:
    s, a = p + ("streaming",), "async_rl."
    name = get(cfg, a + "sampler.name", "in_order")
    if name not in _SAMPLERS:
        raise ConfigRefused(a + "sampler.name", f"{name!r}: known samplers are {', '.join(_SAMPLERS)}")
    d.set(s + ("sampler",), name, a + "sampler.name")
    for key in _SAMPLER_WINDOW_KEYS:
        window = get(cfg, a + "sampler." + key, None)
        if isinstance(window, int):
            d.set(s + ("window",), window, a + "sampler." + key)
            break
    for field, key in (
        ("min_groups_for_streaming_train", "min_groups_for_streaming_train"),
        ("max_inflight_prompts", "max_inflight_prompts"),
        ("max_buffered_rollouts", "max_buffered_rollouts"),
        ("max_infra_attempts_per_prompt", "rollout_failure.max_infra_attempts_per_prompt"),
        ("max_data_attempts_per_prompt", "rollout_failure.max_data_attempts_per_prompt"),
        ("max_skipped_prompts", "rollout_failure.max_skipped_prompts"),
        ("max_consecutive_dropped_prompts", "rollout_failure.max_consecutive_dropped_prompts"),
        ("on_dropped_prompt", "rollout_failure.on_dropped_prompt"),
        ("max_replacement_attempts", "rollout_failure.max_replacement_attempts"),
        ("replacement_reserve_prompts", "rollout_failure.replacement_reserve_prompts"),
        ("watchdog_interval_s", "stall_watchdog.interval_s"),
        ("stall_timeout_s", "stall_watchdog.stall_timeout_s"),
        ("stall_action", "stall_watchdog.stall_action"),
    ):
        value = get(cfg, a + key, None)
        if value is not None:
            d.set(s + (field,), value, a + key)
    budgets = (get(cfg, a + "rollout_failure.max_skipped_prompts", 0) or 0) + (
        get(cfg, a + "rollout_failure.max_consecutive_dropped_prompts", 0) or 0
    )
    d.set(
        s + ("drop_budgets",),
        budgets > 0,
        "async_rl.rollout_failure.max_skipped_prompts / "
        "max_consecutive_dropped_prompts: drops tolerated when either is > 0",
    )
    frac = get(cfg, a + "rollout_failure.min_step_batch_fraction", None)
    if isinstance(frac, (int, float)):
        d.set(s + ("min_step_batch_fraction",), frac, a + "rollout_failure.min_step_batch_fraction")
