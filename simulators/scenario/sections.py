"""The scenario file's sections other than ``pipelines[]``: cluster, costs, scheduler, defaults,
and the per-pipeline sub-sections (disaggregated, weight_sync_groups, data_plane), faults and expect.

Each parser validates one section with the field table (``simulators/scenario/rules.py``)
and the section's own cross-field rules, and returns the frozen spec it describes; the
first problem raises a one-line :class:`~simulators.scenario.fieldcheck.ScenarioError`.
"""

from __future__ import annotations

import math
import os
from dataclasses import fields
from typing import Any, Dict, List, Mapping

from harness.scheduler.options import SchedulerOptions
from simulators.pipelines.dataplane import check_spec as check_data_plane
from simulators.refit.groups import check_spec as check_weight_sync_groups
from simulators.scenario.fieldcheck import Ctx, as_mapping, flat_fields, fmt_num, reject_unknown
from simulators.scenario.rules import engine_fault_problem
from simulators.scenario.spec import (
    FAULT_NAMES,
    ClusterSpec,
    CostSpec,
    DataPlaneSpec,
    DisaggregatedSpec,
    FaultSpec,
    ModelSpec,
    PipelineSpec,
    StreamingSpec,
    WeightSyncGroupsSpec,
    WorkloadSpec,
)

#: the sections ``defaults:`` may give, applied to every pipeline before its own
DEFAULTS_SECTIONS = {"model": ModelSpec, "workload": WorkloadSpec, "streaming": StreamingSpec}


def cluster_section(ctx: Ctx, data: Any) -> ClusterSpec:
    vals = flat_fields(ctx, "cluster", data, ClusterSpec)
    return ClusterSpec(**vals)


def costs_section(ctx: Ctx, data: Any) -> CostSpec:
    costs = CostSpec(**flat_fields(ctx, "costs", data, CostSpec))
    if costs.optimizer_state_multiplier > costs.train_state_multiplier - 1:
        raise ctx.fail(
            "costs.optimizer_state_multiplier",
            f"{fmt_num(costs.optimizer_state_multiplier)} x weight bytes leaves less than the parameters (1x) "
            f"in train_state_multiplier {fmt_num(costs.train_state_multiplier)}",
        )
    return costs


def scheduler_section(ctx: Ctx, data: Any) -> Dict[str, object]:
    data = dict(as_mapping(ctx, "scheduler", data))
    impl = _implementation(ctx, data)  # implementation / source: which scheduler, not an option of the model
    known = tuple(f.name for f in fields(SchedulerOptions))
    reject_unknown(ctx, "scheduler", data, known)
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


def _implementation(ctx: Ctx, data: Dict[str, Any]) -> Dict[str, object]:
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


def defaults_section(ctx: Ctx, data: Any) -> Dict[str, Dict[str, Any]]:
    data = as_mapping(ctx, "defaults", data)
    reject_unknown(ctx, "defaults", data, tuple(DEFAULTS_SECTIONS))
    return {k: flat_fields(ctx, f"defaults.{k}", v, DEFAULTS_SECTIONS[k]) for k, v in data.items()}


def disaggregated_section(ctx: Ctx, path: str, data: Any, train: List[int], infer: List[int]) -> DisaggregatedSpec:
    from harness.control.disaggregated import BATCHINGS, SHAPES, WEIGHT_SYNC_MODES

    spec = DisaggregatedSpec(**flat_fields(ctx, path, data, DisaggregatedSpec))
    if spec.shape not in SHAPES:
        raise ctx.fail(f"{path}.shape", f"unknown shape {spec.shape!r}; known: {', '.join(SHAPES)}")
    if spec.comm_locks and spec.shape != "one_step_off":
        raise ctx.fail(f"{path}.comm_locks", f"only one_step_off runs its sync beside the trainer (not {spec.shape})")
    if spec.weight_sync not in WEIGHT_SYNC_MODES:
        raise ctx.fail(
            f"{path}.weight_sync", f"unknown mode {spec.weight_sync!r}; known: {', '.join(WEIGHT_SYNC_MODES)}"
        )
    if spec.batching not in BATCHINGS:
        raise ctx.fail(f"{path}.batching", f"unknown batching {spec.batching!r}; known: {', '.join(BATCHINGS)}")
    if spec.batching != "completion" and spec.shape != "fully_async":
        raise ctx.fail(f"{path}.batching", f"only fully_async makes its batch by {spec.batching} (not {spec.shape})")
    shared = sorted(set(train) & set(infer))
    if shared:
        raise ctx.fail(
            path.rsplit(".", 1)[0] + ".train_gpus",
            f"train GPUs {shared} are also infer_gpus (a disaggregated pipeline's are disjoint)",
        )
    return spec


def weight_sync_groups_section(ctx: Ctx, path: str, data: Any) -> WeightSyncGroupsSpec:
    spec = WeightSyncGroupsSpec(**flat_fields(ctx, path, data, WeightSyncGroupsSpec))
    problem = check_weight_sync_groups(spec)
    if problem:
        raise ctx.fail(f"{path}.{problem[0]}", problem[1])
    return spec


def data_plane_section(ctx: Ctx, path: str, data: Any, train_gpus: int) -> DataPlaneSpec:
    spec = DataPlaneSpec(**flat_fields(ctx, path, data, DataPlaneSpec))
    problem = check_data_plane(spec, train_gpus)
    if problem:
        raise ctx.fail(f"{path}.{problem[0]}", problem[1])
    return spec


def fault_section(ctx: Ctx, path: str, data: Any, pipelines: Mapping[str, PipelineSpec]) -> FaultSpec:
    vals = flat_fields(ctx, path, data, FaultSpec)
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


def expect_section(ctx: Ctx, raw: Any, pipes: Mapping[str, PipelineSpec]) -> List[Any]:
    """The scenario's expected findings, validated (harness.logs.expect.parse_expectations)."""
    from harness.logs.expect import parse_expectations
    from harness.logs.invariants import CHECKS

    names = set(pipes) | {p.type for p in pipes.values()}
    return parse_expectations(raw, "expect", ctx.fail, CHECKS, pipelines=names, faults=FAULT_NAMES)
