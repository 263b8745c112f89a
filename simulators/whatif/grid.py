"""The grid of a sweep: every combination of the ``--set PATH=V1,V2,...`` values.

Every variant's scenario is built and validated before any run starts, so a value that
makes one variant invalid is reported (one line, naming the ``--set`` values and the
field) instead of failing runs halfway through a sweep.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from simulators.scenario.overrides import (
    Override,
    OverrideError,
    apply_overrides,
    describe,
    parse_path,
    scenario_mapping,
    split_values,
    _yaml_value,
)

MAX_RUNS = 100_000


@dataclass(frozen=True)
class Axis:
    path: str
    values: Tuple[Any, ...]


@dataclass(frozen=True)
class Variant:
    index: int
    overrides: Tuple[Override, ...]
    mapping: dict  # the scenario mapping with the overrides applied (validated)

    @property
    def label(self) -> str:
        return describe(self.overrides)

    @property
    def settings(self) -> dict:
        return {ov.path: ov.value for ov in self.overrides}


def parse_axis(text: str) -> Axis:
    """``PATH=V1,V2,...`` (one value is a fixed setting; commas inside [] or {} stay)."""
    path, sep, raw = text.partition("=")
    path = path.strip()
    if not sep or not path:
        raise OverrideError(f"--set {text}: expected PATH=V1,V2,... (e.g. pipelines[0].infer_tp=1,2)")
    parse_path(path)
    values = tuple(_yaml_value(v, f"--set {path}") for v in split_values(raw))
    if len(set(map(repr, values))) != len(values):
        raise OverrideError(f"--set {path}: a value is listed twice")
    return Axis(path, values)


def build_grid(scenario: Optional[str], axes: Sequence[Axis]) -> Tuple[List[Variant], str]:
    """Every combination, in the order the axes were given (the last varies fastest);
    each validated. Returns the variants and the scenario's source label."""
    from simulators.scenario.loader import ScenarioError, check_feasible, scenario_from_mapping

    paths = [a.path for a in axes]
    if len(set(paths)) != len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise OverrideError(f"--set {dup}: given twice (list every value in one --set)")
    base, source = scenario_mapping(scenario)
    variants: List[Variant] = []
    for index, combo in enumerate(itertools.product(*(a.values for a in axes))):
        overrides = tuple(Override(f"{a.path}={v}", a.path, parse_path(a.path), v) for a, v in zip(axes, combo))
        mapping = apply_overrides(base, overrides)
        label = f"{source} with --set {describe(overrides)}"
        try:
            check_feasible(scenario_from_mapping(mapping, label), label)
        except ScenarioError as e:
            raise OverrideError(str(e)) from None
        variants.append(Variant(index, overrides, mapping))
    return variants, source
