"""One ``pipelines[i]`` entry of a scenario file: its fields, sections, GPU placement and type rules.

Placement is checked with the registration rules of :mod:`harness.scheduler.topology` (the
same ones the scheduler model applies), plus ``validate_partial_overlap`` for ``nemo_async``
pipelines and ``train ⊆ infer`` for ``roll_sync`` pipelines. GPU lists are stored in the
order the registration gives them (RLix's canonical, sorted order).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Dict, List, Mapping, Optional, Tuple

from harness.scheduler.topology import (
    ClusterTopology,
    TopologyError,
    build_pipeline_entry,
    validate_partial_overlap,
    validate_pipeline_id,
)
from harness.scheduler.types import ACTOR_TRAIN, GENERATION_CLUSTER
from simulators.scenario.fieldcheck import (
    Ctx,
    as_mapping,
    check_value,
    flat_fields,
    fmt_num,
    gpu_list,
    join_path,
    reject_unknown,
)
from simulators.scenario.rules import FIELD_RULES, engine_field_problem, refit_export_problem, refit_path_problem
from simulators.scenario.sections import (
    DEFAULTS_SECTIONS,
    data_plane_section,
    disaggregated_section,
    weight_sync_groups_section,
)
from simulators.scenario.spec import PIPELINE_TYPES, CostSpec, ModelSpec, PipelineSpec, WorkloadSpec
from simulators.scenario.streaming import streaming_problem

#: pipeline fields that are sections or GPU lists, parsed by their own code (not FIELD_RULES)
PIPELINE_STRUCTURED = (
    "train_gpus",
    "infer_gpus",
    "model",
    "workload",
    "streaming",
    "data_plane",
    "costs",
    "weight_sync_groups",
    "disaggregated",
)
_PIPELINE_REQUIRED = ("name", "type", "train_gpus", "infer_gpus")


def _workload_cross_checks(ctx: Ctx, path: str, w: WorkloadSpec) -> None:
    if w.decode_tokens_cap_share >= 1:
        raise ctx.fail(
            f"{path}.decode_tokens_cap_share",
            f"must be below 1 (a share of the answers), got {fmt_num(w.decode_tokens_cap_share)}",
        )
    if w.decode_tokens_median > w.decode_tokens_max:
        raise ctx.fail(
            f"{path}.decode_tokens_median",
            f"median {fmt_num(w.decode_tokens_median)} tokens exceeds decode_tokens_max {w.decode_tokens_max} tokens",
        )


def _decode_checks(ctx: Ctx, path: str, w: WorkloadSpec, m: ModelSpec) -> None:
    """The per-step decode's fields: a known timing, and an expert read only where the step
    can tell how many experts a batch routes to (docs/cost-model.md)."""
    if w.decode_timing not in ("at_start", "per_step"):
        raise ctx.fail(f"{path}.workload.decode_timing", f"must be at_start or per_step, got {w.decode_timing!r}")
    if m.num_experts and m.experts_per_token > m.num_experts:
        raise ctx.fail(
            f"{path}.model.experts_per_token",
            f"{m.experts_per_token} routed experts per token exceeds num_experts {m.num_experts}",
        )
    _kv_check(ctx, path, w)
    if w.decode_expert_read_s == 0:
        return
    field = f"{path}.workload.decode_expert_read_s"
    if w.decode_timing != "per_step":
        raise ctx.fail(field, "only a per_step decode (workload.decode_timing) reads the experts a step routes to")
    if not (m.num_experts and m.experts_per_token):
        raise ctx.fail(field, "needs model.num_experts and model.experts_per_token (a mixture of experts)")
    fixed = w.batching_half_point / w.tokens_per_s_per_rank
    if w.decode_expert_read_s > fixed:
        raise ctx.fail(
            field,
            f"{fmt_num(w.decode_expert_read_s)} s exceeds the step's fixed part "
            f"(batching_half_point / tokens_per_s_per_rank = {fmt_num(fixed)} s)",
        )


def _kv_check(ctx: Ctx, path: str, w: WorkloadSpec) -> None:
    """The live-context KV read moves the curve's KV read at the mean context to each running
    sequence's own: per_step only, and no more than the curve's whole per-sequence step at
    that mean (or a short sequence's step would come out negative)."""
    if w.decode_kv_s_per_token == 0:
        return
    field = f"{path}.workload.decode_kv_s_per_token"
    if w.decode_timing != "per_step":
        raise ctx.fail(field, "only a per_step decode (workload.decode_timing) reads each sequence's own context")
    from simulators.pipelines.decode_clock import mean_context

    per_seq = 1.0 / w.tokens_per_s_per_rank
    if w.decode_kv_s_per_token * mean_context(w) > per_seq:
        raise ctx.fail(
            field,
            f"{fmt_num(w.decode_kv_s_per_token)} s x the mean context {fmt_num(mean_context(w))} tokens exceeds "
            f"the per-sequence step (1 / tokens_per_s_per_rank = {fmt_num(per_seq)} s)",
        )


def _topology_path(base: str, e: TopologyError) -> str:
    if e.rule == "pipeline_id":
        return f"{base}.name"
    if e.cluster == GENERATION_CLUSTER and e.rule == "tp_size":
        return f"{base}.infer_tp"
    if e.cluster == ACTOR_TRAIN:
        return f"{base}.train_gpus"
    if e.cluster == GENERATION_CLUSTER:
        return f"{base}.infer_gpus"
    return base


def pipeline_section(
    ctx: Ctx,
    path: str,
    data: Any,
    defaults: Mapping[str, Mapping[str, Any]],
    topo: ClusterTopology,
    scenario_costs: Optional[CostSpec] = None,
    gpu: str = "",
) -> PipelineSpec:
    """One ``pipelines[i]`` entry, checked in a fixed order (scalars, sections, placement,
    the type's layout rules, optional sections) so that the first problem reported is stable."""
    data = as_mapping(ctx, path, data)
    vals = _scalar_fields(ctx, path, data)
    _merge_sections(ctx, path, data, vals, defaults)
    train, infer, entry = _placement(ctx, path, data, vals, topo)
    _layout_rules(ctx, path, data, vals, train, infer, gpu)
    vals["train_gpus"] = tuple(entry.clusters[ACTOR_TRAIN].device_mapping)
    vals["infer_gpus"] = tuple(entry.clusters[GENERATION_CLUSTER].device_mapping)
    _optional_sections(ctx, path, data, vals, len(train), scenario_costs)
    return PipelineSpec(**vals)


def _scalar_fields(ctx: Ctx, path: str, data: Mapping[str, Any]) -> Dict[str, Any]:
    """The pipeline's own (non-section) fields: known, present where required, typed, and
    the enumerated ones (type, train_backend, sleep_level, engine options) in range."""
    known = tuple(FIELD_RULES[PipelineSpec]) + PIPELINE_STRUCTURED
    reject_unknown(ctx, path, data, known)
    for key in _PIPELINE_REQUIRED:
        if key not in data:
            raise ctx.fail(join_path(path, key), "missing (required)")
    rules = FIELD_RULES[PipelineSpec]
    vals: Dict[str, Any] = {k: check_value(ctx, join_path(path, k), data[k], rules[k]) for k in rules if k in data}

    name = vals["name"]
    try:
        validate_pipeline_id(name)
    except TopologyError as e:
        raise ctx.fail(f"{path}.name", e.problem) from None
    if vals["type"] not in PIPELINE_TYPES:
        raise ctx.fail(f"{path}.type", f"unknown pipeline type {vals['type']!r}; known: {', '.join(PIPELINE_TYPES)}")
    if vals.get("train_backend", "megatron") not in ("megatron", "fsdp2"):
        raise ctx.fail(f"{path}.train_backend", f"must be megatron or fsdp2, got {vals['train_backend']!r}")
    if "sleep_level" in vals and vals["sleep_level"] not in (1, 2):
        raise ctx.fail(
            f"{path}.sleep_level",
            f"must be 1 (weights kept in host RAM) or 2 (weights dropped), got {vals['sleep_level']}",
        )
    problem = engine_field_problem(vals)
    if problem is not None:
        raise ctx.fail(f"{path}.{problem[0]}", problem[1])
    return vals


def _merge_sections(
    ctx: Ctx, path: str, data: Mapping[str, Any], vals: Dict[str, Any], defaults: Mapping[str, Mapping[str, Any]]
) -> None:
    """model / workload / streaming: the scenario's ``defaults`` overlaid by the pipeline's
    own, then their cross-field rules (streaming only for a single controller)."""
    for key, cls in DEFAULTS_SECTIONS.items():
        merged = dict(defaults.get(key, {}))
        if key in data:
            merged.update(flat_fields(ctx, f"{path}.{key}", data[key], cls))
        vals[key] = cls(**merged)
    _workload_cross_checks(ctx, f"{path}.workload", vals["workload"])
    _decode_checks(ctx, path, vals["workload"], vals["model"])
    if vals["type"] == "single_controller":
        problem = streaming_problem(vals["streaming"], vals["workload"], vals.get("steps"))
        if problem is not None:
            raise ctx.fail(f"{path}.streaming.{problem[0]}", problem[1])
    elif "streaming" in data:
        raise ctx.fail(f"{path}.streaming", f"only a single_controller pipeline streams (this one is {vals['type']})")


def _placement(
    ctx: Ctx, path: str, data: Mapping[str, Any], vals: Dict[str, Any], topo: ClusterTopology
) -> Tuple[List[int], List[int], Any]:
    """The GPU lists, registered by the scheduler's own topology rules (plus partial overlap
    for nemo_async); returns the lists as given and the registered entry."""
    train = gpu_list(ctx, f"{path}.train_gpus", data["train_gpus"], topo.num_gpus)
    infer = gpu_list(ctx, f"{path}.infer_gpus", data["infer_gpus"], topo.num_gpus)
    tp = vals.get("infer_tp", 1)
    name = vals["name"]
    try:
        entry = build_pipeline_entry(
            name,
            name,
            {ACTOR_TRAIN: 1, GENERATION_CLUSTER: tp},
            {ACTOR_TRAIN: train, GENERATION_CLUSTER: infer},
            topo,
        )
        if vals["type"] == "nemo_async":
            validate_partial_overlap(entry)
    except TopologyError as e:
        raise ctx.fail(_topology_path(path, e), f"{e.problem} (rule: {e.rule})") from None
    return train, infer, entry


def _layout_rules(
    ctx: Ctx,
    path: str,
    data: Mapping[str, Any],
    vals: Dict[str, Any],
    train: List[int],
    infer: List[int],
    gpu: str,
) -> None:
    """What each pipeline type requires of its GPUs (disjoint, train ⊆ infer, ...) and of
    its refit path; parses the disaggregated section, which only that type has."""
    if vals["type"] == "disaggregated":
        vals["disaggregated"] = disaggregated_section(
            ctx, f"{path}.disaggregated", data.get("disaggregated", {}), train, infer
        )
    elif "disaggregated" in data:
        raise ctx.fail(
            f"{path}.disaggregated", f"only a disaggregated pipeline has an order section (this one is {vals['type']})"
        )
    if vals["type"] == "single_controller" and set(train) & set(infer):
        raise ctx.fail(
            f"{path}.train_gpus",
            f"train GPUs {sorted(set(train) & set(infer))} are also infer_gpus "
            "(the single controller is non-colocated)",
        )
    if vals["type"] == "roll_sync":
        outside = sorted(set(train) - set(infer))
        if outside:
            raise ctx.fail(
                f"{path}.train_gpus",
                f"train GPUs {outside} are not in infer_gpus (roll_sync needs train ⊆ infer)",
            )
    problem = refit_path_problem(vals, train, infer, gpu)
    if problem is not None:
        raise ctx.fail(f"{path}.refit_path", problem)
    problem = refit_export_problem(vals)
    if problem is not None:
        raise ctx.fail(f"{path}.refit_export", problem)


def _optional_sections(
    ctx: Ctx,
    path: str,
    data: Mapping[str, Any],
    vals: Dict[str, Any],
    train_gpus: int,
    scenario_costs: Optional[CostSpec],
) -> None:
    """data_plane, weight_sync_groups and the pipeline's own costs (over the scenario's)."""
    if "data_plane" in data:
        vals["data_plane"] = data_plane_section(ctx, f"{path}.data_plane", data["data_plane"], train_gpus)
    if "weight_sync_groups" in data:
        if vals["type"] == "single_controller":
            raise ctx.fail(f"{path}.weight_sync_groups", "not modelled for a single_controller pipeline")
        vals["weight_sync_groups"] = weight_sync_groups_section(
            ctx, f"{path}.weight_sync_groups", data["weight_sync_groups"]
        )
    if "costs" in data:  # the pipeline's own costs, over the scenario's
        base = {f.name: getattr(scenario_costs or CostSpec(), f.name) for f in fields(CostSpec)}
        vals["costs"] = CostSpec(**{**base, **flat_fields(ctx, f"{path}.costs", data["costs"], CostSpec)})
