"""Scenario files: load a YAML scenario into a frozen :class:`~simulators.scenario.spec.Scenario`.

A scenario file mirrors the dataclasses of ``simulators/scenario/spec.py``::

    name: default
    description: two NeMo async pipelines time-sharing 2 GPUs with partial overlap
    seed: 0
    horizon_s: 3600            # simulated seconds
    cluster: {nodes: 1, gpus_per_node: 2}          # ClusterSpec fields
    costs: {wake_s: 0.8}                           # CostSpec fields
    scheduler: {head_of_line_blocking: true}       # SchedulerOptions fields
    defaults:                                      # applied to every pipeline first
      model: {params: 0.5e9}
      workload: {prompts_per_step: 8}
    pipelines:
      - {name: ppl1, type: nemo_async, train_gpus: [0], infer_gpus: [0, 1]}
      - {name: ppl2, type: nemo_async, train_gpus: [1], infer_gpus: [0, 1],
         infer_tp: 1, steps: 4, sleep_level: 2, start_s: 0,
         model: {params: 0.5e9, bytes_per_param: 2}, workload: {...}}
    faults:
      - {name: wake_before_offload, pipeline: ppl1, at_step: 1}

Every problem raises :class:`ScenarioError`, whose ``str`` is one line naming the file,
the field path and the problem (``x.yaml: pipelines[1].infer_gpus: GPU 9 outside the
cluster (0..7)``); malformed YAML names the line instead (``x.yaml:3: malformed YAML:
...``). Nothing is half-built: the first problem stops the load.

Topology is checked with the registration rules of :mod:`harness.scheduler.topology` (the same
ones the scheduler model applies), plus ``validate_partial_overlap`` for ``nemo_async``
pipelines and ``train ⊆ infer`` for ``roll_sync`` pipelines.

GPU lists are stored sorted (RLix's canonical order: DP rank r of the inference
cluster is ``sorted(infer_gpus)[r*tp:(r+1)*tp]``). Numbers given as YAML 1.2 style
exponents without a dot (``25e9``) are read as floats, not strings.
"""

from __future__ import annotations

import math
import os
from dataclasses import fields
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import yaml

from simulators.scenario import limits as scenario_limits
from simulators.scenario.yaml_dialect import ScenarioTextError, read_scenario_text, strict_safe_load

from harness.scheduler.options import SchedulerOptions
from simulators.scenario.policy import check_policy_fields
from harness.scheduler.types import ACTOR_TRAIN, GENERATION_CLUSTER
from harness.scheduler.topology import (
    ClusterTopology,
    TopologyError,
    build_pipeline_entry,
    validate_partial_overlap,
    validate_pipeline_id,
)
from simulators.scenario.spec import (
    FAULT_NAMES,
    PIPELINE_TYPES,
    ClusterSpec,
    CostSpec,
    DataPlaneSpec,
    DisaggregatedSpec,
    WeightSyncGroupsSpec,
    FaultSpec,
    ModelSpec,
    PipelineSpec,
    Scenario,
    StreamingSpec,
    WorkloadSpec,
)
from simulators.pipelines.dataplane import check_spec as check_data_plane
from simulators.refit.groups import check_spec as check_weight_sync_groups
from simulators.costmodel.derive import expand as expand_cost_model

__all__ = ["ScenarioError", "load_scenario", "parse_yaml", "scenario_from_mapping", "FIELD_RULES"]


class ScenarioError(ValueError):
    """A scenario file or mapping is unusable; ``str`` is a single line.

    ``source`` is the file (or label) the scenario came from, ``path`` the dotted field
    path (``pipelines[1].infer_gpus``; ``None`` for file-level problems), ``line`` the
    1-based YAML line for malformed YAML, ``problem`` the bare description.
    """

    def __init__(self, source: str, path: Optional[str], problem: str, *, line: Optional[int] = None):
        problem = " ".join(str(problem).split())  # exactly one line, whatever the cause said
        if line is not None:
            text = f"{source}:{line}: {problem}"
        elif path is not None:
            text = f"{source}: {path}: {problem}"
        else:
            text = f"{source}: {problem}"
        super().__init__(text)
        self.source = source
        self.path = path
        self.problem = problem
        self.line = line


from simulators.scenario.rules import (  # noqa: E402  (the field table lives there)
    FIELD_RULES,
    Rule,
    engine_fault_problem,
    engine_field_problem,
    refit_export_problem,
    refit_path_problem,
)
from simulators.scenario.streaming import streaming_problem  # noqa: E402
from simulators.scenario.bounds import BoundError, check_cost_inputs  # noqa: E402


_PIPELINE_STRUCTURED = (
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
_SCENARIO_STRUCTURED = ("cluster", "costs", "scheduler", "pipelines", "faults", "expect")
_PIPELINE_REQUIRED = ("name", "type", "train_gpus", "infer_gpus")
_SCENARIO_REQUIRED = ("name", "cluster", "pipelines")
_DEFAULTS_SECTIONS = {"model": ModelSpec, "workload": WorkloadSpec, "streaming": StreamingSpec}


# --------------------------------------------------------------------------------------
# Helpers


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return repr(value)


def _fmt_num(x: Union[int, float]) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x)) if abs(x) < 1e6 else f"{x:g}"
    return f"{x:g}" if isinstance(x, float) else str(x)


class _Ctx:
    """Error factory bound to one source label."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, path: Optional[str], problem: str) -> ScenarioError:
        return ScenarioError(self.source, path, problem)


def _check_value(ctx: _Ctx, path: str, value: Any, rule: Rule) -> Any:
    unit = f" ({rule.unit})" if rule.unit else ""
    if rule.kind == "str":
        if not isinstance(value, str):
            raise ctx.fail(path, f"expected a string, got {_describe(value)}")
        return value
    if rule.kind == "bool":
        if not isinstance(value, bool):
            raise ctx.fail(path, f"expected true or false, got {_describe(value)}")
        return value
    if rule.kind == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            raise ctx.fail(path, f"expected an integer{unit}, got {_describe(value)}")
        x: Union[int, float] = value
    else:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ctx.fail(path, f"expected a number{unit}, got {_describe(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ctx.fail(path, f"must be a finite number{unit}, got {value!r}")
        x = float(value)
    bad = {
        ">0": x <= 0,
        ">=0": x < 0,
        ">=1": x < 1,
        "(0,1]": not (0 < x <= 1),
        "": False,
    }[rule.bound]
    if bad:
        need = {">0": "> 0", ">=0": ">= 0", ">=1": ">= 1", "(0,1]": "in (0, 1]"}[rule.bound]
        raise ctx.fail(path, f"must be {need}{unit}, got {_fmt_num(value)}")
    return x


def _mapping(ctx: _Ctx, path: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ctx.fail(path, f"expected a mapping, got {_describe(value)}")
    for key in value:
        if not isinstance(key, str):
            raise ctx.fail(path, f"keys must be strings, got {_describe(key)}")
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _reject_unknown(ctx: _Ctx, path: str, data: Mapping[str, Any], known: Tuple[str, ...]) -> None:
    for key in data:
        if key not in known:
            shown = str(key) if str(key).isprintable() else repr(str(key))  # a "\n" key stays one line
            raise ctx.fail(_join(path, shown), f"unknown field; known: {', '.join(sorted(known))}")


def _flat_fields(ctx: _Ctx, path: str, data: Mapping[str, Any], cls: type) -> Dict[str, Any]:
    """Validate the fields of a flat dataclass (all entries in FIELD_RULES) present in ``data``."""
    rules = FIELD_RULES[cls]
    data = _mapping(ctx, path, data)
    _reject_unknown(ctx, path, data, tuple(rules))
    return {k: _check_value(ctx, _join(path, k), v, rules[k]) for k, v in data.items()}


def _gpu_list(ctx: _Ctx, path: str, value: Any, num_gpus: int) -> List[int]:
    if not isinstance(value, (list, tuple)):
        raise ctx.fail(path, f"expected a list of GPU ids, got {_describe(value)}")
    if not value:
        raise ctx.fail(path, "must list at least one GPU")
    for i, g in enumerate(value):
        if not isinstance(g, int) or isinstance(g, bool):
            raise ctx.fail(f"{path}[{i}]", f"expected an integer GPU id, got {_describe(g)}")
    outside = sorted({g for g in value if g < 0 or g >= num_gpus})
    if outside:
        ids = ", ".join(str(g) for g in outside)
        noun = "GPU" if len(outside) == 1 else "GPUs"
        raise ctx.fail(path, f"{noun} {ids} outside the cluster (0..{num_gpus - 1})")
    return list(value)


# --------------------------------------------------------------------------------------
# Sections


def _cluster(ctx: _Ctx, data: Any) -> ClusterSpec:
    vals = _flat_fields(ctx, "cluster", data, ClusterSpec)
    return ClusterSpec(**vals)


def _costs(ctx: _Ctx, data: Any) -> CostSpec:
    costs = CostSpec(**_flat_fields(ctx, "costs", data, CostSpec))
    if costs.optimizer_state_multiplier > costs.train_state_multiplier - 1:
        raise ctx.fail(
            "costs.optimizer_state_multiplier",
            f"{_fmt_num(costs.optimizer_state_multiplier)} x weight bytes leaves less than the parameters (1x) "
            f"in train_state_multiplier {_fmt_num(costs.train_state_multiplier)}",
        )
    return costs


def _scheduler(ctx: _Ctx, data: Any) -> Dict[str, object]:
    data = dict(_mapping(ctx, "scheduler", data))
    impl = _implementation(ctx, data)  # implementation / source: which scheduler, not an option of the model
    known = tuple(f.name for f in fields(SchedulerOptions))
    _reject_unknown(ctx, "scheduler", data, known)
    for key, value in data.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ctx.fail(f"scheduler.{key}", f"must be a finite number, got {value!r}")
        try:
            SchedulerOptions.from_mapping({key: value})
        except ValueError as e:
            raise ctx.fail(f"scheduler.{key}", str(e)) from None
    opts = SchedulerOptions.from_mapping(data)
    if opts.demand_floor and opts.policy != "gap_ratio":
        raise ctx.fail(
            "scheduler.demand_floor", f"a variant of RLix's gap-ratio planner; policy {opts.policy!r} does not use it"
        )
    # Keep only the options the file names (normalized: ints given for floats become floats).
    return {**{key: getattr(opts, key) for key in data}, **impl}


def _implementation(ctx: _Ctx, data: Dict[str, Any]) -> Dict[str, object]:
    """``implementation: model | rlix`` and, for rlix, ``source``: the checkout RLix's scheduler
    is imported from (docs/rlix-live.md), checked here so that drift is bad input found
    before the run (one line naming what the checkout lacks)."""
    impl = data.pop("implementation", "model")
    source = data.pop("source", None)
    if impl not in ("model", "rlix"):
        raise ctx.fail("scheduler.implementation", f"must be model or rlix, got {impl!r}")
    if impl == "model":
        if source is not None:
            raise ctx.fail("scheduler.source", "only with implementation: rlix")
        return {}
    if not isinstance(source, str) or not source:
        raise ctx.fail("scheduler.source", "implementation rlix needs the RLix checkout's path")
    if not os.path.isabs(source) and ctx.source not in ("", "<scenario>") and os.path.exists(ctx.source):
        source = os.path.join(os.path.dirname(os.path.abspath(ctx.source)), source)
    from simulators.rlix_live.loader import RlixLoadError, load_rlix

    try:
        load_rlix(source)
    except RlixLoadError as e:
        raise ctx.fail("scheduler.source", str(e)) from None
    return {"implementation": "rlix", "source": os.path.abspath(source)}


def _defaults(ctx: _Ctx, data: Any) -> Dict[str, Dict[str, Any]]:
    data = _mapping(ctx, "defaults", data)
    _reject_unknown(ctx, "defaults", data, tuple(_DEFAULTS_SECTIONS))
    return {k: _flat_fields(ctx, f"defaults.{k}", v, _DEFAULTS_SECTIONS[k]) for k, v in data.items()}


def _workload_cross_checks(ctx: _Ctx, path: str, w: WorkloadSpec) -> None:
    if w.decode_tokens_cap_share >= 1:
        raise ctx.fail(
            f"{path}.decode_tokens_cap_share",
            f"must be below 1 (a share of the answers), got {_fmt_num(w.decode_tokens_cap_share)}",
        )
    if w.decode_tokens_median > w.decode_tokens_max:
        raise ctx.fail(
            f"{path}.decode_tokens_median",
            f"median {_fmt_num(w.decode_tokens_median)} tokens exceeds decode_tokens_max {w.decode_tokens_max} tokens",
        )


def _decode_checks(ctx: _Ctx, path: str, w: WorkloadSpec, m: ModelSpec) -> None:
    """The per-step decode's fields: a known timing, and an expert read only where the step
    can tell how many experts a batch routes to (docs/cost-model.md)."""
    if w.decode_timing not in ("at_start", "per_step"):
        raise ctx.fail(f"{path}.workload.decode_timing", f"must be at_start or per_step, got {w.decode_timing!r}")
    if m.num_experts and m.experts_per_token > m.num_experts:
        raise ctx.fail(
            f"{path}.model.experts_per_token",
            f"{m.experts_per_token} routed experts per token exceeds num_experts {m.num_experts}",
        )
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
            f"{_fmt_num(w.decode_expert_read_s)} s exceeds the step's fixed part "
            f"(batching_half_point / tokens_per_s_per_rank = {_fmt_num(fixed)} s)",
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


def _pipeline(
    ctx: _Ctx,
    path: str,
    data: Any,
    defaults: Mapping[str, Mapping[str, Any]],
    topo: ClusterTopology,
    scenario_costs: Optional[CostSpec] = None,
    gpu: str = "",
) -> PipelineSpec:
    data = _mapping(ctx, path, data)
    known = tuple(FIELD_RULES[PipelineSpec]) + _PIPELINE_STRUCTURED
    _reject_unknown(ctx, path, data, known)
    for key in _PIPELINE_REQUIRED:
        if key not in data:
            raise ctx.fail(_join(path, key), "missing (required)")
    rules = FIELD_RULES[PipelineSpec]
    vals: Dict[str, Any] = {k: _check_value(ctx, _join(path, k), data[k], rules[k]) for k in rules if k in data}

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

    for key, cls in _DEFAULTS_SECTIONS.items():
        merged = dict(defaults.get(key, {}))
        if key in data:
            merged.update(_flat_fields(ctx, f"{path}.{key}", data[key], cls))
        vals[key] = cls(**merged)
    _workload_cross_checks(ctx, f"{path}.workload", vals["workload"])
    _decode_checks(ctx, path, vals["workload"], vals["model"])
    if vals["type"] == "single_controller":
        problem = streaming_problem(vals["streaming"], vals["workload"], vals.get("steps"))
        if problem is not None:
            raise ctx.fail(f"{path}.streaming.{problem[0]}", problem[1])
    elif "streaming" in data:
        raise ctx.fail(f"{path}.streaming", f"only a single_controller pipeline streams (this one is {vals['type']})")

    train = _gpu_list(ctx, f"{path}.train_gpus", data["train_gpus"], topo.num_gpus)
    infer = _gpu_list(ctx, f"{path}.infer_gpus", data["infer_gpus"], topo.num_gpus)
    tp = vals.get("infer_tp", 1)
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
    if vals["type"] == "disaggregated":
        vals["disaggregated"] = _disaggregated(
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
    vals["train_gpus"] = tuple(entry.clusters[ACTOR_TRAIN].device_mapping)
    vals["infer_gpus"] = tuple(entry.clusters[GENERATION_CLUSTER].device_mapping)
    if "data_plane" in data:
        vals["data_plane"] = _data_plane(ctx, f"{path}.data_plane", data["data_plane"], len(train))
    if "weight_sync_groups" in data:
        if vals["type"] == "single_controller":
            raise ctx.fail(f"{path}.weight_sync_groups", "not modelled for a single_controller pipeline")
        vals["weight_sync_groups"] = _weight_sync_groups(ctx, f"{path}.weight_sync_groups", data["weight_sync_groups"])
    if "costs" in data:  # the pipeline's own costs, over the scenario's
        base = {f.name: getattr(scenario_costs or CostSpec(), f.name) for f in fields(CostSpec)}
        vals["costs"] = CostSpec(**{**base, **_flat_fields(ctx, f"{path}.costs", data["costs"], CostSpec)})
    return PipelineSpec(**vals)


def _disaggregated(ctx: _Ctx, path: str, data: Any, train: List[int], infer: List[int]) -> DisaggregatedSpec:
    from harness.control.disaggregated import SHAPES, WEIGHT_SYNC_MODES

    spec = DisaggregatedSpec(**_flat_fields(ctx, path, data, DisaggregatedSpec))
    if spec.shape not in SHAPES:
        raise ctx.fail(f"{path}.shape", f"unknown shape {spec.shape!r}; known: {', '.join(SHAPES)}")
    if spec.comm_locks and spec.shape != "one_step_off":
        raise ctx.fail(f"{path}.comm_locks", f"only one_step_off runs its sync beside the trainer (not {spec.shape})")
    if spec.weight_sync not in WEIGHT_SYNC_MODES:
        raise ctx.fail(
            f"{path}.weight_sync", f"unknown mode {spec.weight_sync!r}; known: {', '.join(WEIGHT_SYNC_MODES)}"
        )
    shared = sorted(set(train) & set(infer))
    if shared:
        raise ctx.fail(
            path.rsplit(".", 1)[0] + ".train_gpus",
            f"train GPUs {shared} are also infer_gpus (a disaggregated pipeline's are disjoint)",
        )
    return spec


def _weight_sync_groups(ctx: _Ctx, path: str, data: Any) -> WeightSyncGroupsSpec:
    spec = WeightSyncGroupsSpec(**_flat_fields(ctx, path, data, WeightSyncGroupsSpec))
    problem = check_weight_sync_groups(spec)
    if problem:
        raise ctx.fail(f"{path}.{problem[0]}", problem[1])
    return spec


def _data_plane(ctx: _Ctx, path: str, data: Any, train_gpus: int) -> DataPlaneSpec:
    spec = DataPlaneSpec(**_flat_fields(ctx, path, data, DataPlaneSpec))
    problem = check_data_plane(spec, train_gpus)
    if problem:
        raise ctx.fail(f"{path}.{problem[0]}", problem[1])
    return spec


def _fault(ctx: _Ctx, path: str, data: Any, pipelines: Mapping[str, PipelineSpec]) -> FaultSpec:
    vals = _flat_fields(ctx, path, data, FaultSpec)
    for key in ("name", "pipeline"):
        if key not in vals:
            raise ctx.fail(f"{path}.{key}", "missing (required)")
    if vals["name"] not in FAULT_NAMES:
        raise ctx.fail(f"{path}.name", f"unknown fault {vals['name']!r}; known: {', '.join(FAULT_NAMES)}")
    pipe = pipelines.get(vals["pipeline"])
    if pipe is None:
        raise ctx.fail(f"{path}.pipeline", f"unknown pipeline {vals['pipeline']!r}; known: {', '.join(pipelines)}")
    at = vals.get("at_step", 0)
    if at >= pipe.steps:
        raise ctx.fail(
            f"{path}.at_step",
            f"step {at} is never reached: pipeline {pipe.name} runs steps 0..{pipe.steps - 1}",
        )
    problem = engine_fault_problem(vals["name"], pipe)
    if problem is not None:
        raise ctx.fail(f"{path}.name", problem)
    return FaultSpec(**vals)


def _expect(ctx: _Ctx, raw: Any, pipes: Mapping[str, PipelineSpec]) -> List[Any]:
    """The scenario's expected findings, validated (harness.logs.expect.parse_expectations)."""
    from harness.logs.expect import parse_expectations
    from harness.logs.invariants import CHECKS

    names = set(pipes) | {p.type for p in pipes.values()}
    return parse_expectations(raw, "expect", ctx.fail, CHECKS, pipelines=names, faults=FAULT_NAMES)


# --------------------------------------------------------------------------------------
# Public API


def scenario_from_mapping(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a parsed scenario mapping and build the frozen :class:`Scenario`."""
    ctx = _Ctx(str(source))
    if data is None:
        raise ctx.fail("(top level)", "empty scenario; expected a mapping with name, cluster and pipelines")
    if not isinstance(data, Mapping):
        raise ctx.fail("(top level)", f"expected a mapping, got {_describe(data)}")
    data = _mapping(ctx, "(top level)", data)
    try:  # bounds before formulas
        check_cost_inputs(data, lambda path, value, rule: _check_value(ctx, path, value, rule))
    except BoundError as e:
        raise ctx.fail(e.path, e.problem) from None
    data = expand_cost_model(data, ctx.fail, str(source))  # presets and derived costs, where the file gives none
    known = tuple(FIELD_RULES[Scenario]) + _SCENARIO_STRUCTURED + ("defaults",)
    _reject_unknown(ctx, "", data, known)
    for key in _SCENARIO_REQUIRED:
        if key not in data:
            raise ctx.fail(key, "missing (required)")
    rules = FIELD_RULES[Scenario]
    vals: Dict[str, Any] = {k: _check_value(ctx, k, data[k], rules[k]) for k in rules if k in data}
    scenario_limits.check_name(ctx.fail, vals["name"])

    cluster = _cluster(ctx, data["cluster"])
    scenario_limits.check_cluster_size(ctx.fail, cluster.nodes, cluster.gpus_per_node)
    topo = ClusterTopology(cluster.nodes, cluster.gpus_per_node)
    costs = _costs(ctx, data["costs"]) if "costs" in data else CostSpec()
    if vals.get("refit_calibration"):
        from simulators.refit.calibration import CalibrationError, apply_calibration

        try:
            vals["refit_calibration"], costs = apply_calibration(
                vals["refit_calibration"], source, costs, explicit=set(data.get("costs") or {})
            )
        except CalibrationError as e:
            raise ctx.fail("refit_calibration", str(e)) from None
    scheduler = _scheduler(ctx, data["scheduler"]) if "scheduler" in data else {}
    defaults = _defaults(ctx, data["defaults"]) if "defaults" in data else {}

    raw_pipes = data["pipelines"]
    if not isinstance(raw_pipes, list):
        raise ctx.fail("pipelines", f"expected a list of pipelines, got {_describe(raw_pipes)}")
    if not raw_pipes:
        raise ctx.fail("pipelines", "must name at least one pipeline")
    horizon = vals.get("horizon_s", Scenario.__dataclass_fields__["horizon_s"].default)
    scenario_limits.check_scale(ctx.fail, horizon, raw_pipes)
    trajectories = 0
    pipes: Dict[str, PipelineSpec] = {}
    first_index: Dict[str, int] = {}
    for i, raw in enumerate(raw_pipes):
        p = _pipeline(ctx, f"pipelines[{i}]", raw, defaults, topo, costs, cluster.gpu)
        trajectories += scenario_limits.check_pipeline(ctx.fail, f"pipelines[{i}]", p)
        if p.name in pipes:
            raise ctx.fail(
                f"pipelines[{i}].name", f"duplicate pipeline name {p.name!r} (also pipelines[{first_index[p.name]}])"
            )
        if p.start_s >= horizon:
            raise ctx.fail(
                f"pipelines[{i}].start_s", f"{_fmt_num(p.start_s)} s is not before horizon_s {_fmt_num(horizon)} s"
            )
        pipes[p.name] = p
        first_index[p.name] = i
    scenario_limits.check_run_total(ctx.fail, trajectories)
    check_policy_fields(ctx.fail, scheduler, list(pipes.values()))

    faults: List[FaultSpec] = []
    if "faults" in data:
        raw_faults = data["faults"]
        if not isinstance(raw_faults, list):
            raise ctx.fail("faults", f"expected a list of faults, got {_describe(raw_faults)}")
        faults = [_fault(ctx, f"faults[{i}]", raw, pipes) for i, raw in enumerate(raw_faults)]
    expect = _expect(ctx, data["expect"], pipes) if "expect" in data else []

    return Scenario(
        cluster=cluster,
        pipelines=tuple(pipes.values()),
        costs=costs,
        scheduler=scheduler,
        faults=tuple(faults),
        expect=tuple(expect),
        **vals,
    )


def parse_yaml(text: str, source: str) -> Any:
    """Parse scenario YAML text; problems raise :class:`ScenarioError` with the line."""
    try:
        return strict_safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "cannot parse"
        if mark is not None:
            raise ScenarioError(
                source, None, f"malformed YAML: {problem} (column {mark.column + 1})", line=mark.line + 1
            ) from None
        raise ScenarioError(source, None, f"malformed YAML: {problem}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(source, None, f"malformed YAML: {e}") from None


def read_mapping(path: Union[str, Path]) -> Any:
    """Read and parse a scenario file into its mapping (not validated yet)."""
    source = str(path)
    try:
        text = read_scenario_text(path)
    except ScenarioTextError as e:
        raise ScenarioError(source, None, f"cannot read: {e}") from None
    except OSError as e:
        raise ScenarioError(source, None, f"cannot read: {e.strerror or e}") from None
    return parse_yaml(text, source)


def load_scenario(path: Union[str, Path]) -> Scenario:
    """Read, parse and validate a scenario file."""
    source = str(path)
    scenario = scenario_from_mapping(read_mapping(path), source)
    check_feasible(scenario, source)
    return scenario


def check_feasible(scenario: Scenario, source: str) -> None:
    """Refuse a layout the model is certain not to run (``simulators/scenario/feasibility.py``):
    a scenario file is checked by the rules before it is simulated or called valid."""
    from simulators.scenario.feasibility import infeasible

    problem = infeasible(scenario)
    if problem is not None:
        raise ScenarioError(source, problem[0], problem[1])


def _check_rules_cover_spec() -> None:
    """Every field of the spec dataclasses has a rule or a structured handler (import-time guard)."""
    extra = {PipelineSpec: _PIPELINE_STRUCTURED, Scenario: _SCENARIO_STRUCTURED}
    for cls, rules in FIELD_RULES.items():
        names = {f.name for f in fields(cls)}
        covered = set(rules) | set(extra.get(cls, ()))
        if names != covered:
            raise AssertionError(f"FIELD_RULES out of date for {cls.__name__}: {sorted(names ^ covered)}")


_check_rules_cover_spec()
