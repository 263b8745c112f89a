"""Fill a scenario mapping's cost fields from its GPU and model presets, before validation.

Runs on the parsed mapping, so whatever the file states stays as stated: a field is
derived only where neither the pipeline's own section, the ``defaults`` section nor the
scenario's ``costs`` give it (explicit wins; a scenario without ``cluster.gpu`` is loaded
exactly as before). Derived per pipeline, since each has its own model and TP:

* ``model``: a ``preset`` fills ``params`` and the architecture;
* ``workload``: ``tokens_per_s_per_rank``, ``batching_half_point``, ``max_concurrent_per_rank``;
* ``costs`` (the pipeline's own section): ``train_s_per_trajectory``,
  ``old_log_probs_s_per_trajectory`` (from the pipeline's training layout ``train_tp`` ...
  ``train_global_batch``, ``train_recompute`` and ``log_prob_passes``), ``wake_s``, ``sleep_s``,
  and on NeMo RL's colocated refit ``refit_gather_s`` (from the layout and ``refit_export``).

A ``step_calibration`` file (``rlharness calibrate step``) first fills the scenario's
``costs`` efficiency factors it does not set.

The cluster's links and memory come from the GPU preset the same way.
"""

from __future__ import annotations

import copy
from dataclasses import fields
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from simulators.costmodel import formulas as f
from simulators.costmodel import refit_formulas as rf
from simulators.costmodel.colocation import train_s, trains_on_dedicated_gpus
from simulators.costmodel.fsdp2 import fsdp2_pass_s
from simulators.costmodel.hardware import GPU_PRESETS, GpuSpec, cluster_fields
from simulators.costmodel.models import MODEL_PRESETS, PRESET_FIELDS
from simulators.costmodel.packing import PackedPass, packed_pass, quantile_lengths

Fail = Callable[[str, str], Exception]
_ARCH = ("layers", "hidden_size", "num_kv_heads", "head_dim")


def _section(data: Mapping[str, Any], key: str) -> Dict[str, Any]:
    value = data.get(key)
    return dict(value) if isinstance(value, Mapping) else {}


def expand(data: Any, fail: Fail, source: str = "<scenario>") -> Any:
    """A copy of the scenario mapping with presets and derived costs filled in."""
    if not isinstance(data, Mapping):
        return data
    data = copy.deepcopy(dict(data))
    _step_calibration(data, source, fail)
    cluster = data.get("cluster")
    gpu = _gpu(cluster, fail) if isinstance(cluster, Mapping) else None
    if gpu is not None:
        gpus_per_node = cluster.get("gpus_per_node", 2)
        for key, value in cluster_fields(gpu, gpus_per_node if isinstance(gpus_per_node, int) else 2).items():
            cluster.setdefault(key, value)
    defaults = _section(data, "defaults")
    pipes = data.get("pipelines")
    if not isinstance(pipes, list):
        return data
    for i, pipe in enumerate(pipes):
        if isinstance(pipe, dict):
            _pipeline(data, pipe, f"pipelines[{i}]", defaults, gpu, fail, trains_on_dedicated_gpus(pipes, i))
    return data


def _step_calibration(data: dict, source: str, fail: Fail) -> None:
    """A ``step_calibration`` file's efficiency factors become the scenario's ``costs``
    wherever that section gives none (explicit wins; ``rlharness calibrate step``)."""
    path = data.get("step_calibration")
    if path in (None, ""):
        return
    if not isinstance(path, str):
        raise fail("step_calibration", f"expected a file path, got {path!r}")
    from simulators.refit.calibration import resolve
    from simulators.costmodel.stepfit import StepTimingsError
    from simulators.costmodel.stepfit_parse import load_calibration

    full = resolve(path, source)
    try:
        factors = load_calibration(full)["costs"]
    except StepTimingsError as e:
        raise fail("step_calibration", str(e)) from None
    costs = data.get("costs")
    if costs is None:
        costs = data["costs"] = {}
    if isinstance(costs, dict):
        for key, value in factors.items():
            costs.setdefault(key, value)
    data["step_calibration"] = full


def _gpu(cluster: Mapping[str, Any], fail: Fail) -> Optional[GpuSpec]:
    name = cluster.get("gpu")
    if name in (None, ""):
        return None
    if not isinstance(name, str) or name not in GPU_PRESETS:
        raise fail("cluster.gpu", f"unknown GPU preset {name!r}; known: {', '.join(sorted(GPU_PRESETS))}")
    return GPU_PRESETS[name]


def _pipeline(
    data: dict,
    pipe: dict,
    path: str,
    defaults: Mapping[str, Any],
    gpu: Optional[GpuSpec],
    fail: Fail,
    dedicated: bool = False,
) -> None:
    """One pipeline's model preset, then (with a GPU preset and the model's architecture)
    its derived workload curve and costs, each only where neither the pipeline nor the
    defaults nor the scenario's costs give it."""
    model = _model_preset(pipe, path, defaults, fail)
    if gpu is None or not all(isinstance(model.get(k), int) and model[k] > 0 for k in _ARCH):
        return  # nothing to derive from: the explicit (or default) costs apply
    from simulators.scenario.spec import CostSpec, WorkloadSpec

    costs_given = {**_section(data, "costs"), **_section(pipe, "costs")}
    cost_vals = {fl.name: costs_given.get(fl.name, fl.default) for fl in fields(CostSpec)}
    if not _factors_valid(cost_vals):
        return  # validation names the bad factor
    workload_given = {**_section(defaults, "workload"), **_section(pipe, "workload")}
    wl = {fl.name: workload_given.get(fl.name, fl.default) for fl in fields(WorkloadSpec)}
    arch, eff = _arch(model), _efficiency(cost_vals)
    share = wl["decode_tokens_cap_share"]
    share = share if isinstance(share, (int, float)) and not isinstance(share, bool) and 0 <= share < 1 else 0.0
    decode = f.mean_decode_tokens(wl["decode_tokens_median"], wl["decode_tokens_sigma"], wl["decode_tokens_max"], share)
    tokens = wl["prompt_tokens"] + decode
    tp = pipe.get("infer_tp", 1) if isinstance(pipe.get("infer_tp", 1), int) else 1
    cluster = data["cluster"]
    links = _links(cluster, gpu)
    link = links.for_group(tp, eff)  # a TP group wider than a node all-reduces over the NICs
    derived_workload = f.decode_curve(
        arch,
        tp,
        wl["prompt_tokens"] + decode / 2.0,
        gpu.bf16_flops,
        gpu.hbm_bytes_per_s,
        float(link),
        eff,
        gpus_per_node=links.gpus_per_node,
    )
    capacity = f.kv_capacity(
        arch, tp, float(cluster.get("vram_bytes", gpu.hbm_bytes)), cost_vals["kv_cache_fraction"], tokens, eff
    )
    if capacity < 1:
        raise fail(
            f"{path}.model",
            f"{arch.params:.3g} parameters and one trajectory's KV cache ({tokens:.0f} tokens) do not "
            f"fit {tp} x {gpu.name} at kv_cache_fraction {cost_vals['kv_cache_fraction']} (raise infer_tp)",
        )
    derived_workload["max_concurrent_per_rank"] = capacity
    if "tokens_per_s_per_rank" in workload_given or "batching_half_point" in workload_given:
        del (
            derived_workload["decode_timing"],
            derived_workload["decode_expert_read_s"],
            derived_workload["decode_kv_s_per_token"],
        )  # a hand-set curve keeps its timing
    trajectories = wl["prompts_per_step"] * wl["generations_per_prompt"]
    derived_costs = {
        **_training(pipe, path, arch, tokens, trajectories, cluster, gpu, eff, fail, dedicated, wl),
        **f.wake_sleep_s(eff),
        **_refit_gather(pipe, arch, cluster, gpu, eff),
    }
    _fill(pipe, "workload", derived_workload, workload_given)
    _fill(pipe, "costs", derived_costs, costs_given)


def _model_preset(pipe: dict, path: str, defaults: Mapping[str, Any], fail: Fail) -> Dict[str, Any]:
    """The pipeline's model fields (defaults overlaid by its own), a ``preset`` filling the
    ones neither gives, written into the pipeline's own ``model`` section."""
    model = {**_section(defaults, "model"), **_section(pipe, "model")}
    preset = model.get("preset")
    if preset not in (None, ""):
        if not isinstance(preset, str) or preset not in MODEL_PRESETS:
            raise fail(
                f"{path}.model.preset", f"unknown model preset {preset!r}; known: {', '.join(sorted(MODEL_PRESETS))}"
            )
        p = MODEL_PRESETS[preset]
        own = pipe.setdefault("model", {}) if isinstance(pipe.get("model", {}), dict) else None
        if own is not None:
            for key in PRESET_FIELDS:
                if key not in model:
                    own[key] = getattr(p, key)
                    model[key] = own[key]
    return model


_FACTORS = (
    "train_mfu",
    "moe_train_mfu",
    "decode_flops_efficiency",
    "moe_decode_flops_efficiency",
    "hbm_efficiency",
    "link_efficiency",
)


def _factors_valid(cost_vals: Mapping[str, Any]) -> bool:
    """Whether the efficiency factors and the decode step's overhead are usable numbers; if
    not, nothing is derived and validation names the bad field."""
    if not all(
        isinstance(cost_vals[k], (int, float)) and not isinstance(cost_vals[k], bool) and 0 < cost_vals[k] <= 1
        for k in _FACTORS
    ):
        return False
    overhead = cost_vals["decode_step_overhead_s"]
    return isinstance(overhead, (int, float)) and not isinstance(overhead, bool) and 0 <= overhead < float("inf")


def _arch(model: Mapping[str, Any]) -> f.Arch:
    from simulators.scenario.spec import ModelSpec

    num = lambda m, k, cls: m.get(k, getattr(cls, k) if not callable(getattr(cls, k, None)) else None)
    params = float(model.get("params", ModelSpec.params))
    active = float(model.get("active_params") or params)
    return f.Arch(
        params,
        active,
        model["layers"],
        model["hidden_size"],
        model["num_kv_heads"] * model["head_dim"],
        int(num(model, "bytes_per_param", ModelSpec)),
        int(model.get("experts_per_token") or 0),
        int(model.get("num_experts") or 0),
    )


def _efficiency(cost_vals: Mapping[str, Any]) -> f.Efficiency:
    return f.Efficiency(
        cost_vals["train_mfu"],
        cost_vals["decode_flops_efficiency"],
        cost_vals["hbm_efficiency"],
        cost_vals["tp_allreduce_latency_s"],
        cost_vals["max_num_seqs"],
        cost_vals["wake_fixed_s"],
        cost_vals["sleep_fixed_s"],
        cost_vals["moe_train_mfu"],
        cost_vals["link_efficiency"],
        decode_step_overhead_s=cost_vals["decode_step_overhead_s"],
        moe_decode_flops_efficiency=cost_vals["moe_decode_flops_efficiency"],
    )


_LAYOUT = ("train_tp", "train_pp", "train_cp", "train_ep", "train_micro_batch", "train_global_batch", "train_sp")


def _training(
    pipe: Mapping[str, Any],
    path: str,
    arch: "f.Arch",
    tokens: float,
    seqs: int,
    cluster: Mapping[str, Any],
    gpu: GpuSpec,
    eff: "f.Efficiency",
    fail: Fail,
    dedicated: bool = False,
    wl: Optional[Mapping[str, Any]] = None,
) -> Dict[str, float]:
    """Per-trajectory training and log-prob costs of the pipeline's layout: the simulator
    charges ``x · n / G`` for n trajectories on G training GPUs, so x = wall · G / n. The
    training pass is charged :func:`colocation.train_s` of it: a dense rate is colocated
    training's (faster on ``dedicated`` GPUs by the colocated-training factor), a MoE rate
    dedicated training's (slower by it on GPUs shared with an inference engine)."""
    gpus = len(pipe.get("train_gpus") or ()) or 1
    layout = _layout(pipe)
    if layout is None:
        return {}  # validation names the field
    problem = f.layout_problem(gpus, layout)
    if problem is not None:
        field = "train_backend" if problem.startswith("fsdp2") else "train_sp" if "train_sp" in problem else "train_tp"
        raise fail(f"{path}.{field}", problem)
    links = _links(cluster, gpu)
    if layout.backend == "fsdp2":
        for key in ("train_pack_tokens", "log_prob_pack_tokens"):
            if pipe.get(key, 0):
                raise fail(f"{path}.{key}", "sequence packing is modelled for train_backend megatron only")
        train = fsdp2_pass_s(arch, layout, seqs, tokens, gpus, gpu.bf16_flops, links, eff, backward=True)
        fwd = fsdp2_pass_s(arch, layout, seqs, tokens, gpus, gpu.bf16_flops, links, eff, backward=False)
    else:
        train_pack, fwd_pack = _packing(pipe, path, layout, gpus, seqs, wl, fail)
        train = f.train_pass_s(arch, layout, seqs, tokens, gpus, gpu.bf16_flops, links, eff, True, train_pack)
        fwd = f.train_pass_s(arch, layout, seqs, tokens, gpus, gpu.bf16_flops, links, eff, False, fwd_pack)
    passes = pipe.get("log_prob_passes", 1)
    # 0: the trainer takes the log-probs the rollout engine returned with each answer (verl's
    # rollout.calculate_log_probs); the stage then costs nothing
    passes = passes if isinstance(passes, int) and not isinstance(passes, bool) and passes >= 0 else 1
    return {
        "train_s_per_trajectory": train_s(train["total"], dedicated, arch.moe) * gpus / seqs,
        "old_log_probs_s_per_trajectory": passes * fwd["total"] * gpus / seqs,
    }


def _packing(
    pipe: Mapping[str, Any],
    path: str,
    layout: "f.Parallel",
    gpus: int,
    seqs: int,
    wl: Optional[Mapping[str, Any]],
    fail: Fail,
) -> Tuple[Optional[PackedPass], Optional[PackedPass]]:
    """The packed training and log-prob passes where the pipeline packs sequences
    (``train_pack_tokens`` / ``log_prob_pack_tokens`` > 0; ``simulators/costmodel/packing.py``):
    training packs each global batch, the log-prob pass the whole step. A bin shorter than
    the longest trajectory is refused, as NeMo RL's packer refuses it."""
    sizes = {k: pipe.get(k, 0) for k in ("train_pack_tokens", "log_prob_pack_tokens")}
    if wl is None or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in sizes.values()):
        return None, None  # validation names a bad field
    if not any(sizes.values()) or layout.pp == 1:
        return None, None  # without pipeline stages packing pads nothing and m sets no bubble
    cap_share = wl["decode_tokens_cap_share"]
    lengths = quantile_lengths(
        seqs,
        wl["prompt_tokens"],
        wl["decode_tokens_median"],
        wl["decode_tokens_sigma"],
        wl["decode_tokens_max"],
        cap_share if isinstance(cap_share, (int, float)) and 0 <= cap_share < 1 else 0.0,
    )
    dp = gpus // (layout.tp * layout.pp * layout.cp)
    chunks = {"train_pack_tokens": layout.global_batch or seqs, "log_prob_pack_tokens": seqs}
    longest = wl["prompt_tokens"] + wl["decode_tokens_max"]
    out = []
    for key, capacity in sizes.items():
        if capacity and capacity < longest:
            raise fail(
                f"{path}.{key}",
                f"a bin of {capacity} tokens is shorter than the longest trajectory "
                f"({longest:g} = prompt_tokens + decode_tokens_max)",
            )
        out.append(packed_pass(lengths, capacity, chunks[key], dp, layout.pp) if capacity else None)
    return out[0], out[1]


def _layout(pipe: Mapping[str, Any]) -> Optional["f.Parallel"]:
    """The pipeline's training layout as given (1s where it gives none); None where a value
    is out of range (validation names it)."""
    given = {k: pipe[k] for k in _LAYOUT if isinstance(pipe.get(k), int) and not isinstance(pipe.get(k), bool)}
    recompute = pipe.get("train_recompute", False) is True  # anything else: validation names it
    backend = pipe.get("train_backend", "megatron")
    if backend not in ("megatron", "fsdp2"):
        return None
    layout = f.Parallel(
        given.get("train_tp", 1),
        given.get("train_pp", 1),
        given.get("train_cp", 1),
        given.get("train_ep", 1),
        given.get("train_micro_batch", 1),
        given.get("train_global_batch", 0),
        recompute,
        backend,
        given.get("train_sp", 1),
    )
    if min(layout.tp, layout.pp, layout.cp, layout.ep, layout.micro_batch, layout.sp) < 1 or layout.global_batch < 0:
        return None
    return layout


def _refit_gather(
    pipe: Mapping[str, Any], arch: "f.Arch", cluster: Mapping[str, Any], gpu: GpuSpec, eff: "f.Efficiency"
) -> Dict[str, float]:
    """``costs.refit_gather_s`` of a pipeline on NeMo RL's colocated refit
    (``refit_path: colocated_ipc``): every GPU gathers each tensor whole from the training
    layout before the hand-over (``refit_formulas.refit_gather_s``, the way ``refit_export``
    names). Nothing for the CPU-cache path (RLix's), or where a field is bad (validation
    names it)."""
    if pipe.get("refit_path") != "colocated_ipc":
        return {}
    export = pipe.get("refit_export", "megatron_bridge")
    layout = _layout(pipe)
    gpus = len(pipe.get("train_gpus") or ()) or 1
    if export not in rf.REFIT_EXPORTS or layout is None or f.layout_problem(gpus, layout) is not None:
        return {}
    return {"refit_gather_s": rf.refit_gather_s(arch, layout, gpus, _links(cluster, gpu), eff, export)["total"]}


def _links(cluster: Mapping[str, Any], gpu: GpuSpec) -> "f.Links":
    per_node = cluster.get("gpus_per_node", 2)
    per_node = per_node if isinstance(per_node, int) and not isinstance(per_node, bool) and per_node > 0 else 2
    return f.Links(
        float(cluster.get("intra_node_bytes_per_s", gpu.nvlink_bytes_per_s or gpu.pcie_bytes_per_s)),
        float(cluster.get("inter_node_bytes_per_s", gpu.nic_bytes_per_s * per_node)) / per_node,
        per_node,
    )


def _fill(pipe: dict, key: str, derived: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    own = pipe.setdefault(key, {})
    if not isinstance(own, dict):
        return  # a malformed section: validation reports it under its path
    for name, value in derived.items():
        if name not in given:
            own[name] = value
