"""Bounds before formulas: every scalar the cost model reads is checked against its field
rule before a derived cost is computed.

The cost model (:mod:`simulators.costmodel.derive`) fills a scenario's costs from its GPU
and model presets *before* the scenario is validated, so that what it derives is
validated like what a user writes. Its formulas divide by the cluster's size and links,
the pipeline's TP/PP/CP/EP, the workload's batch and the efficiency factors; a zero
there was a ``ZeroDivisionError`` traceback (a crash reported as a finding). This pass
runs the same field rules (``scenario_rules.FIELD_RULES``) on every scalar a cost-model
section holds, in file order, so a bad value is the usual one line naming the field
(``pipelines[0].infer_tp: must be > 0 ...``), exit 2, before any work. Unknown keys and
sections of the wrong shape are left to the full validation, which names them.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from simulators.scenario.rules import FIELD_RULES, Rule
from simulators.scenario.spec import ClusterSpec, CostSpec, ModelSpec, PipelineSpec, StreamingSpec, WorkloadSpec

CheckValue = Callable[[str, Any, Rule], Any]


class BoundError(ValueError):
    """A value its field rule allows but no formula can take: (field path, problem)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path, self.problem = path, problem


#: the largest log-space sigma of the answer lengths: e^(sigma^2/2) (the mean's factor) stays
#: a float up to sigma ~37; a sigma of 10 already puts the median answer 1e43 times under its mean
MAX_DECODE_SIGMA = 10.0

#: pipeline (and ``defaults``) sections the cost model reads, and their field rules
_PIPELINE_SECTIONS = {"model": ModelSpec, "workload": WorkloadSpec, "costs": CostSpec, "streaming": StreamingSpec}


def _section(check: CheckValue, path: str, data: Any, cls: type) -> None:
    if not isinstance(data, Mapping):
        return
    rules = FIELD_RULES[cls]
    for key, value in data.items():
        if isinstance(key, str) and key in rules:
            checked = check(f"{path}.{key}", value, rules[key])
            if cls is WorkloadSpec and key == "decode_tokens_sigma" and checked > MAX_DECODE_SIGMA:
                raise BoundError(f"{path}.{key}", f"must be <= {MAX_DECODE_SIGMA:g} (log-space sigma), got {value!r}")


def check_cost_inputs(data: Mapping[str, Any], check: CheckValue) -> None:
    """Run ``check(path, value, rule)`` on every known scalar of ``cluster``, ``costs``,
    ``defaults.<section>`` and each pipeline (its own scalars and sections)."""
    _section(check, "cluster", data.get("cluster"), ClusterSpec)
    _section(check, "costs", data.get("costs"), CostSpec)
    defaults = data.get("defaults")
    if isinstance(defaults, Mapping):
        for key, cls in _PIPELINE_SECTIONS.items():
            _section(check, f"defaults.{key}", defaults.get(key), cls)
    pipes = data.get("pipelines")
    if not isinstance(pipes, list):
        return
    for i, pipe in enumerate(pipes):
        if not isinstance(pipe, Mapping):
            continue
        path = f"pipelines[{i}]"
        _section(check, path, {k: v for k, v in pipe.items() if k not in _PIPELINE_SECTIONS}, PipelineSpec)
        for key, cls in _PIPELINE_SECTIONS.items():
            _section(check, f"{path}.{key}", pipe.get(key), cls)
