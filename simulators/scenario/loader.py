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

from dataclasses import fields
from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple, Union

import yaml

from harness.scheduler.topology import ClusterTopology
from simulators.costmodel.derive import expand as expand_cost_model
from simulators.scenario import limits as scenario_limits
from simulators.scenario.bounds import BoundError, check_cost_inputs
from simulators.scenario.fieldcheck import (
    Ctx,
    ScenarioError,
    as_mapping,
    check_value,
    describe,
    fmt_num,
    reject_unknown,
)
from simulators.scenario.pipeline_section import PIPELINE_STRUCTURED, pipeline_section
from simulators.scenario.policy import check_policy_fields
from simulators.scenario.rules import FIELD_RULES
from simulators.scenario.sections import (
    cluster_section,
    costs_section,
    defaults_section,
    expect_section,
    fault_section,
    scheduler_section,
)
from simulators.scenario.spec import CostSpec, FaultSpec, PipelineSpec, Scenario
from simulators.scenario.yaml_dialect import ScenarioTextError, read_scenario_text, strict_safe_load

__all__ = ["ScenarioError", "load_scenario", "parse_yaml", "scenario_from_mapping", "FIELD_RULES"]


_SCENARIO_STRUCTURED = ("cluster", "costs", "scheduler", "pipelines", "faults", "expect")
_SCENARIO_REQUIRED = ("name", "cluster", "pipelines")


def scenario_from_mapping(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a parsed scenario mapping and build the frozen :class:`Scenario`."""
    ctx = Ctx(str(source))
    data, vals = _top_level(ctx, data, str(source))
    cluster = cluster_section(ctx, data["cluster"])
    scenario_limits.check_cluster_size(ctx.fail, cluster.nodes, cluster.gpus_per_node)
    topo = ClusterTopology(cluster.nodes, cluster.gpus_per_node)
    costs = costs_section(ctx, data["costs"]) if "costs" in data else CostSpec()
    if vals.get("refit_calibration"):
        from simulators.refit.calibration import CalibrationError, apply_calibration

        try:
            vals["refit_calibration"], costs = apply_calibration(
                vals["refit_calibration"], source, costs, explicit=set(data.get("costs") or {})
            )
        except CalibrationError as e:
            raise ctx.fail("refit_calibration", str(e)) from None
    scheduler = scheduler_section(ctx, data["scheduler"]) if "scheduler" in data else {}
    defaults = defaults_section(ctx, data["defaults"]) if "defaults" in data else {}
    pipes = _pipelines(ctx, data["pipelines"], vals, defaults, topo, costs, cluster.gpu)
    check_policy_fields(ctx.fail, scheduler, list(pipes.values()))
    faults = _faults(ctx, data["faults"], pipes) if "faults" in data else []
    expect = expect_section(ctx, data["expect"], pipes) if "expect" in data else []

    return Scenario(
        cluster=cluster,
        pipelines=tuple(pipes.values()),
        costs=costs,
        scheduler=scheduler,
        faults=tuple(faults),
        expect=tuple(expect),
        **vals,
    )


def _top_level(ctx: Ctx, data: Any, source: str) -> Tuple[Mapping[str, Any], Dict[str, Any]]:
    """The file's mapping with the cost model applied (bounds first, then presets and derived
    costs where the file gives none), and its scalar top-level fields, checked."""
    if data is None:
        raise ctx.fail("(top level)", "empty scenario; expected a mapping with name, cluster and pipelines")
    if not isinstance(data, Mapping):
        raise ctx.fail("(top level)", f"expected a mapping, got {describe(data)}")
    data = as_mapping(ctx, "(top level)", data)
    try:  # bounds before formulas
        check_cost_inputs(data, lambda path, value, rule: check_value(ctx, path, value, rule))
    except BoundError as e:
        raise ctx.fail(e.path, e.problem) from None
    data = expand_cost_model(data, ctx.fail, source)  # presets and derived costs, where the file gives none
    known = tuple(FIELD_RULES[Scenario]) + _SCENARIO_STRUCTURED + ("defaults",)
    reject_unknown(ctx, "", data, known)
    for key in _SCENARIO_REQUIRED:
        if key not in data:
            raise ctx.fail(key, "missing (required)")
    rules = FIELD_RULES[Scenario]
    vals: Dict[str, Any] = {k: check_value(ctx, k, data[k], rules[k]) for k in rules if k in data}
    scenario_limits.check_name(ctx.fail, vals["name"])
    return data, vals


def _pipelines(
    ctx: Ctx,
    raw_pipes: Any,
    vals: Mapping[str, Any],
    defaults: Mapping[str, Mapping[str, Any]],
    topo: ClusterTopology,
    costs: CostSpec,
    gpu: str,
) -> Dict[str, PipelineSpec]:
    """Every pipeline by name, in file order: each valid, names unique, each starting before
    the horizon, and the run within the size limits."""
    if not isinstance(raw_pipes, list):
        raise ctx.fail("pipelines", f"expected a list of pipelines, got {describe(raw_pipes)}")
    if not raw_pipes:
        raise ctx.fail("pipelines", "must name at least one pipeline")
    horizon = vals.get("horizon_s", Scenario.__dataclass_fields__["horizon_s"].default)
    scenario_limits.check_scale(ctx.fail, horizon, raw_pipes)
    trajectories = 0
    pipes: Dict[str, PipelineSpec] = {}
    first_index: Dict[str, int] = {}
    for i, raw in enumerate(raw_pipes):
        p = pipeline_section(ctx, f"pipelines[{i}]", raw, defaults, topo, costs, gpu)
        trajectories += scenario_limits.check_pipeline(ctx.fail, f"pipelines[{i}]", p)
        if p.name in pipes:
            raise ctx.fail(
                f"pipelines[{i}].name", f"duplicate pipeline name {p.name!r} (also pipelines[{first_index[p.name]}])"
            )
        if p.start_s >= horizon:
            raise ctx.fail(
                f"pipelines[{i}].start_s", f"{fmt_num(p.start_s)} s is not before horizon_s {fmt_num(horizon)} s"
            )
        pipes[p.name] = p
        first_index[p.name] = i
    scenario_limits.check_run_total(ctx.fail, trajectories)
    return pipes


def _faults(ctx: Ctx, raw_faults: Any, pipes: Mapping[str, PipelineSpec]) -> List[FaultSpec]:
    if not isinstance(raw_faults, list):
        raise ctx.fail("faults", f"expected a list of faults, got {describe(raw_faults)}")
    return [fault_section(ctx, f"faults[{i}]", raw, pipes) for i, raw in enumerate(raw_faults)]


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
    extra = {PipelineSpec: PIPELINE_STRUCTURED, Scenario: _SCENARIO_STRUCTURED}
    for cls, rules in FIELD_RULES.items():
        names = {f.name for f in fields(cls)}
        covered = set(rules) | set(extra.get(cls, ()))
        if names != covered:
            raise AssertionError(f"FIELD_RULES out of date for {cls.__name__}: {sorted(names ^ covered)}")


_check_rules_cover_spec()
