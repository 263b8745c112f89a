"""ROLL pipeline configs (RLVR and agentic, ``examples/**/*.yaml``) -> one ``roll_sync`` pipeline.

The config is read as ROLL's Hydra entry point reads it: the ``defaults:`` list's
``FILE@_here_`` entries merged at the top level first, the file itself last (Hydra's
``_self_`` default), interpolations as OmegaConf resolves them. ``device_mapping`` strings
(``list(range(0,16))``, ``"[0, 1, ]"``) are parsed, not evaluated. The translation:

* ``actor_train.device_mapping`` / ``actor_infer.device_mapping`` -> the GPUs, with
  ``num_gpus_per_node`` the cluster's node size;
* Megatron's TP/PP/CP/EP from ``actor_train.strategy_args.strategy_config``, vLLM's TP,
  ``gpu_memory_utilization`` and ``sleep_level`` from ``actor_infer``'s;
* RLVR: ``rollout_batch_size`` prompts x ``num_return_sequences_in_group``; agentic:
  ``train_env_manager.num_env_groups`` x ``group_size`` trajectories whose turns
  (``max_actions_per_traj`` x ``max_new_tokens``, within ``sequence_length``) are drawn as
  one decode: environment time is not modelled.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from simulators.config_import.common import (
    ConfigRefused,
    device_mapping,
    get,
    load_yaml,
    merge,
    model_preset,
    scenario_name,
    start_draft,
    typed,
)
from simulators.config_import.draft import ScenarioDraft

_TRAIN = "actor_train.strategy_args.strategy_config."
_INFER = "actor_infer.strategy_args.strategy_config."


def load(path: str) -> Tuple[Dict[str, Any], List[str]]:
    cfg = load_yaml(path)
    chain: List[str] = []
    defaults = cfg.pop("defaults", None)
    if defaults is None:
        return cfg, chain
    if not isinstance(defaults, list):
        raise ConfigRefused("defaults", f"expected Hydra's defaults list, got {defaults!r}")
    base: Dict[str, Any] = {}
    for entry in defaults:
        if entry == "_self_":
            continue
        target, at, package = str(entry).partition("@")
        if not at or package != "_here_":
            raise ConfigRefused("defaults", f"entry {entry!r}: only FILE@_here_ entries (merged at the top) are read")
        parent = os.path.normpath(
            os.path.join(os.path.dirname(path), target + ("" if target.endswith(".yaml") else ".yaml"))
        )
        if not os.path.isfile(parent):
            raise ConfigRefused("defaults", f"{entry!r}: no such file next to {os.path.basename(path)}")
        chain.append(os.path.basename(parent))
        base = merge(base, load_yaml(parent, "defaults"))
    return merge(base, cfg), chain


def _refuse_unsupported(cfg: Dict[str, Any]) -> None:
    if not isinstance(get(cfg, "actor_infer", None), dict) or not isinstance(get(cfg, "actor_train", None), dict):
        missing = "actor_infer" if not isinstance(get(cfg, "actor_infer", None), dict) else "actor_train"
        raise ConfigRefused(
            missing,
            "absent: not an RL pipeline config (SFT, DPO and environment configs have no "
            "rollout and training pair to simulate)",
        )
    for key, why in (
        ("teacher", "a teacher model (distillation) is not modelled"),
        ("critic", "a critic model is not modelled (GRPO-style only)"),
    ):
        if isinstance(get(cfg, key, None), dict):
            raise ConfigRefused(key, why)
    infer = str(get(cfg, "actor_infer.strategy_args.strategy_name", "vllm"))
    if infer != "vllm":
        raise ConfigRefused("actor_infer.strategy_args.strategy_name", f"{infer!r}: only vLLM generation is modelled")
    if get(cfg, "actor_train.model_args.lora_target", None) or get(cfg, "actor_train.model_args.lora_rank", None):
        raise ConfigRefused(
            "actor_train.model_args.lora_rank", "LoRA trains adapters, not the full training state the model charges"
        )
    ratio = get(cfg, "async_generation_ratio", 0) or 0
    if ratio > 0:
        raise ConfigRefused(
            "async_generation_ratio",
            f"{ratio}: generation running ahead of training is not "
            "modelled for ROLL (roll_sync generates each step's batch in turn)",
        )
    for name, reward in (get(cfg, "rewards", None) or {}).items():
        if isinstance(reward, dict) and reward.get("device_mapping"):
            raise ConfigRefused(f"rewards.{name}.device_mapping", "a reward model on GPUs is not modelled")
    for key in (_TRAIN + "offload_optimizer", "actor_train.strategy_args.strategy_config.cpu_offload"):
        if get(cfg, key, False) is True:
            raise ConfigRefused(key, "true: training state held in host memory is not modelled")


def translate(
    cfg: Dict[str, Any], source: str, chain: List[str], *, gpu: str, steps: int, name: Optional[str] = None
) -> ScenarioDraft:
    name = name or scenario_name(source)
    d = start_draft(
        "the ROLL config", "roll-config", os.path.basename(source), chain, name, (typed(cfg, "seed", int, 0), "seed")
    )
    _refuse_unsupported(cfg)
    gpn = typed(cfg, "num_gpus_per_node", int, 8)
    if gpn < 1:
        raise ConfigRefused("num_gpus_per_node", "must be >= 1")
    train, infer = gpus(cfg)
    nodes = math.ceil((max(train + infer) + 1) / gpn)
    d.set(("cluster", "nodes"), nodes, "the highest GPU of the device mappings / num_gpus_per_node, rounded up")
    d.set(
        ("cluster", "gpus_per_node"),
        gpn,
        "num_gpus_per_node" if "num_gpus_per_node" in cfg else "num_gpus_per_node: not in the config, ROLL's default 8",
    )
    d.set(("cluster", "gpu"), gpu, "--gpu (a ROLL config names no GPU type)")
    add_pipeline(d, 0, cfg, name, steps, train, infer)
    return d


def gpus(cfg: Dict[str, Any]) -> Tuple[List[int], List[int]]:
    return (
        device_mapping(get(cfg, "actor_train.device_mapping"), "actor_train.device_mapping"),
        device_mapping(get(cfg, "actor_infer.device_mapping"), "actor_infer.device_mapping"),
    )


def add_pipeline(
    d: ScenarioDraft, index: int, cfg: Dict[str, Any], name: str, steps: int, train: List[int], infer: List[int]
) -> None:
    _refuse_unsupported(cfg)
    p = ("pipelines", index)
    d.set(p + ("name",), re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64], "the config's name")
    d.set(p + ("type",), "roll_sync", "a ROLL pipeline (RLVR or agentic): roll_sync")
    d.set(p + ("train_gpus",), train, "actor_train.device_mapping")
    d.set(p + ("infer_gpus",), infer, "actor_infer.device_mapping")
    d.set(p + ("infer_tp",), typed(cfg, _INFER + "tensor_parallel_size", int, 1), _INFER + "tensor_parallel_size")
    megatron = str(get(cfg, "actor_train.strategy_args.strategy_name", "")).startswith("megatron")
    tp = pp = cp = 1
    if megatron:
        for field, key in (
            ("train_tp", "tensor_model_parallel_size"),
            ("train_pp", "pipeline_model_parallel_size"),
            ("train_cp", "context_parallel_size"),
            ("train_ep", "expert_model_parallel_size"),
        ):
            d.set(p + (field,), typed(cfg, _TRAIN + key, int, 1), _TRAIN + key)
        tp, pp, cp = (
            typed(cfg, _TRAIN + k, int, 1)
            for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
        )
    recompute = (
        get(cfg, _TRAIN + "recompute_granularity", None) == "full"
        or get(cfg, "actor_train.model_args.disable_gradient_checkpointing", True) is False
    )
    d.set(
        p + ("train_recompute",),
        bool(recompute),
        "actor_train: strategy_config.recompute_granularity = full or "
        "model_args.disable_gradient_checkpointing = false",
    )
    micro = typed(cfg, "actor_train.training_args.per_device_train_batch_size", int, 1)
    accum = typed(cfg, "actor_train.training_args.gradient_accumulation_steps", int, 1)
    dp = max(1, len(train) // (tp * pp * cp))
    d.set(p + ("train_micro_batch",), micro, "actor_train.training_args.per_device_train_batch_size")
    d.set(
        p + ("train_global_batch",),
        micro * accum * dp,
        f"per_device_train_batch_size x gradient_accumulation_steps x data-parallel size = {micro} x {accum} x {dp}",
    )
    kl = (
        (get(cfg, "init_kl_coef", 0) or 0) > 0
        or get(cfg, "add_token_level_kl", False) is True
        or get(cfg, "use_kl_loss", False) is True
    )
    d.set(
        p + ("log_prob_passes",),
        2 if kl else 1,
        "init_kl_coef / add_token_level_kl / use_kl_loss: "
        + ("the reference model's pass too" if kl else "no KL term"),
    )
    d.set(p + ("model", "preset"), model_preset(get(cfg, "pretrain"), "pretrain"), "pretrain")
    dtype = str(get(cfg, "actor_train.model_args.dtype", "bf16"))
    if dtype not in ("bf16", "fp16", "fp32", "bfloat16", "float16", "float32"):
        raise ConfigRefused("actor_train.model_args.dtype", f"{dtype!r}: expected bf16, fp16 or fp32")
    d.set(p + ("model", "bytes_per_param"), 4 if "32" in dtype else 2, "actor_train.model_args.dtype")
    d.set(p + ("steps",), steps, f"--steps (the config runs max_steps = {get(cfg, 'max_steps', '?')})")
    level = get(cfg, _INFER + "sleep_level", None)
    if isinstance(level, int):
        d.set(p + ("sleep_level",), level, _INFER + "sleep_level")
    _workload(d, p, cfg)
    util = get(cfg, _INFER + "gpu_memory_utilization", None)
    if isinstance(util, (int, float)):
        d.set(p + ("costs", "kv_cache_fraction"), util, _INFER + "gpu_memory_utilization")
    off = get(cfg, "actor_train.offload_nccl", get(cfg, "offload_nccl", None))
    if isinstance(off, bool):
        d.set(p + ("offload_nccl",), off, "actor_train.offload_nccl")


def _workload(d: ScenarioDraft, p: Tuple[Any, ...], cfg: Dict[str, Any]) -> None:
    w = p + ("workload",)
    new = typed(cfg, "actor_infer.generating_args.max_new_tokens", int, 0) or typed(cfg, "response_length", int, 0)
    if isinstance(get(cfg, "train_env_manager", None), dict):
        groups = typed(cfg, "train_env_manager.num_env_groups", int)
        size = typed(cfg, "train_env_manager.group_size", int)
        d.set(
            w + ("prompts_per_step",), groups, "train_env_manager.num_env_groups (agentic: one environment per group)"
        )
        d.set(w + ("generations_per_prompt",), size, "train_env_manager.group_size")
        seq = typed(cfg, "sequence_length", int)
        turns = typed(cfg, "max_actions_per_traj", int, 0)
        cap = min(seq, turns * new) if turns and new else seq
        d.set(
            w + ("decode_tokens_max",),
            cap,
            "min(sequence_length, max_actions_per_traj x actor_infer.generating_args."
            "max_new_tokens): a trajectory's turns drawn as one decode",
        )
    else:
        d.set(w + ("prompts_per_step",), typed(cfg, "rollout_batch_size", int), "rollout_batch_size")
        d.set(
            w + ("generations_per_prompt",),
            typed(cfg, "num_return_sequences_in_group", int, 1),
            "num_return_sequences_in_group",
        )
        if not new:
            raise ConfigRefused("actor_infer.generating_args.max_new_tokens", "missing (and no response_length)")
        cap = new
        d.set(w + ("decode_tokens_max",), cap, "actor_infer.generating_args.max_new_tokens (response_length)")
        prompt = typed(cfg, "prompt_length", int, 0)
        if prompt:
            d.set(
                w + ("prompt_tokens",),
                min(prompt, 256),
                f"prompt_length = {prompt} is a cap; the workload's 256 tokens within it (the dataset's prompts)",
            )
    d.set(
        w + ("decode_tokens_median",),
        min(512, max(1, cap // 2)),
        "not in the config (the answers' lengths): the workload's 512 tokens, at most half of decode_tokens_max",
    )
