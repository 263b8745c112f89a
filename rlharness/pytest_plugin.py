"""The rlharness pytest plugin (entry point ``pytest11: rlharness``): installing rlharness
makes it available in any project's pytest.

Fixtures:

* ``rlharness_run(scenario=None, *, overrides=None, seed=None, write=False)`` — load a
  scenario (a YAML path, a mapping, a :class:`~simulators.scenario.spec.Scenario`, or ``None``
  for the default), apply ``overrides`` (``{"pipelines[0].steps": 2, "horizon_s": 600}``:
  dotted field paths, as in the scenario error messages), simulate it and return a
  :class:`SimRun`: ``.reason``, ``.records``, ``.of_kind(kind)``, ``.violations``,
  ``.violation_names``, ``.summary`` (figures), ``.summary_text``, ``.out_dir`` (with
  ``write=True`` the run folder is written under the test's ``tmp_path``; ``explore=SEED``
  orders same-time events by a schedule seed, docs/exploration.md). Findings
  against the scenario's ``expect:`` list and an optional ``baseline=`` (a baseline file
  path, or a list of expectation mappings): ``.unexpected`` (what should fail a test),
  ``.expected``, ``.expected_not_found``, ``.verdict`` (docs/expected-findings.md).
* ``rlharness_scenario(scenario=None, *, overrides=None)`` — the validated scenario only.

Markers:

* ``gate`` — the test launches a GPU gate under torchrun (gloo on CPU); skipped, with
  the reason, where torch is not installed.
* ``gpu`` — the test needs a CUDA GPU; skipped, with the reason, where torch sees none.

Nothing heavy is imported until a fixture or marker is used: this module is loaded into
every pytest session of an environment that has rlharness installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

import pytest

MARKERS = {
    "gate": "gate: launches a GPU gate under torchrun (gloo on CPU); skipped where torch is not installed",
    "gpu": "gpu: needs a CUDA GPU; skipped where torch sees none",
}


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)


def _torch_status() -> Optional[str]:
    """``None`` when torch imports, else why not."""
    try:
        import torch  # noqa: F401
    except Exception as e:  # an import of a broken build can raise anything
        return f"torch is not importable ({type(e).__name__}: {e})"
    return None


def gpu_skip_reason() -> Optional[str]:
    missing = _torch_status()
    if missing:
        return f"needs a CUDA GPU: {missing}"
    import torch

    if not torch.cuda.is_available():
        return f"needs a CUDA GPU: torch {torch.__version__} sees none (torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    reasons: Dict[str, Optional[str]] = {}
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            if "gpu" not in reasons:
                reasons["gpu"] = gpu_skip_reason()
            if reasons["gpu"]:
                item.add_marker(pytest.mark.skip(reason=reasons["gpu"]))
        elif item.get_closest_marker("gate") is not None:
            if "gate" not in reasons:
                missing = _torch_status()
                reasons["gate"] = f"gate tests need torch.distributed: {missing}" if missing else None
            if reasons["gate"]:
                item.add_marker(pytest.mark.skip(reason=reasons["gate"]))


# ----------------------------------------------------------------------------- overrides

_PATH = re.compile(r"[A-Za-z_]\w*(?:\[\d+\])*(?:\.[A-Za-z_]\w*(?:\[\d+\])*)*")
_STEP = re.compile(r"([A-Za-z_]\w*)|\[(\d+)\]")


def _path_steps(path: str) -> List[Any]:
    """``"pipelines[0].workload.steps"`` -> ``["pipelines", 0, "workload", "steps"]``."""
    if not _PATH.fullmatch(path):
        raise ValueError(f"override {path!r}: not a field path like 'pipelines[0].steps'")
    return [m.group(1) if m.group(1) else int(m.group(2)) for m in _STEP.finditer(path)]


def apply_overrides(mapping: Dict[str, Any], overrides: Mapping[str, Any]) -> Dict[str, Any]:
    """Set each dotted ``path`` of ``overrides`` in ``mapping`` (in place; returned).
    Missing mappings on the way are created; list indices must exist."""
    for path, value in overrides.items():
        steps = _path_steps(path)
        node: Any = mapping
        for i, step in enumerate(steps[:-1]):
            if isinstance(step, int):
                if not isinstance(node, list) or step >= len(node):
                    raise ValueError(
                        f"override {path!r}: {'.'.join(map(str, steps[:i])) or 'scenario'} has no item {step}"
                    )
                node = node[step]
            else:
                if not isinstance(node, dict):
                    raise ValueError(f"override {path!r}: cannot set a field inside a non-mapping")
                node = node.setdefault(step, {})
        last = steps[-1]
        if isinstance(last, int):
            if not isinstance(node, list) or last >= len(node):
                raise ValueError(f"override {path!r}: no item {last} to replace")
        elif not isinstance(node, dict):
            raise ValueError(f"override {path!r}: cannot set a field inside a non-mapping")
        node[last] = value
    return mapping


def load(scenario: Any = None, overrides: Optional[Mapping[str, Any]] = None):
    """The validated :class:`~simulators.scenario.spec.Scenario` for ``scenario`` plus ``overrides``."""
    import os

    from simulators.scenario.loader import load_scenario, parse_yaml, scenario_from_mapping
    from simulators.scenario.dump import scenario_to_mapping
    from simulators.scenario.spec import Scenario, default_scenario

    if scenario is None:
        source, mapping = "<default scenario>", scenario_to_mapping(default_scenario())
    elif isinstance(scenario, Scenario):
        source, mapping = f"<scenario {scenario.name}>", scenario_to_mapping(scenario)
    elif isinstance(scenario, Mapping):
        source, mapping = "<mapping>", _copy(scenario)
    elif isinstance(scenario, (str, os.PathLike)):
        if not overrides:
            return load_scenario(scenario)
        from simulators.scenario.yaml_dialect import read_scenario_text

        source = str(scenario)
        mapping = parse_yaml(read_scenario_text(scenario), source)
        if not isinstance(mapping, dict):
            return scenario_from_mapping(mapping, source)  # its error names the problem
    else:
        raise TypeError(f"scenario must be a path, a mapping, a Scenario or None, not {type(scenario).__name__}")
    if overrides:
        apply_overrides(mapping, overrides)
    return scenario_from_mapping(mapping, source)


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(v) for v in value]
    return value


# ----------------------------------------------------------------------------- the run


@dataclass
class SimRun:
    """A finished simulation, ready for assertions."""

    scenario: Any
    result: Any  # simulators.runtime.simulation.RunResult
    violations: List[Any]  # harness.logs.invariants.Violation
    summary: Any  # harness.logs.outputs.summary.Summary
    summary_text: str
    out_dir: Optional[str] = None
    files: List[str] = field(default_factory=list)
    verdict: Any = None  # harness.logs.expect.Verdict

    @property
    def unexpected(self) -> List[Any]:
        """Findings no expectation covers (harness.logs.expect.Finding): assert this is empty."""
        return list(self.verdict.unexpected)

    @property
    def expected(self) -> List[Any]:
        """Findings an expectation covers."""
        return [f for f, _ in self.verdict.expected]

    @property
    def expected_not_found(self) -> List[Any]:
        """Expectations that matched nothing (what ``--strict`` fails on)."""
        return list(self.verdict.not_found)

    @property
    def reason(self) -> str:
        """``done``, ``horizon`` or ``failed``."""
        return self.result.reason

    @property
    def records(self) -> List[Dict[str, Any]]:
        return self.result.records

    def of_kind(self, *kinds: str) -> List[Dict[str, Any]]:
        return [r for r in self.result.records if r["kind"] in kinds]

    @property
    def violation_names(self) -> List[str]:
        """Names of the invariant checks that fired, sorted, each once."""
        return sorted({v.invariant for v in self.violations})

    def pipeline(self, pipeline_id: str):
        """The summary figures of one pipeline (steps_done, mean_step_s, ...)."""
        for p in self.summary.pipelines:
            if p.pipeline_id == pipeline_id:
                return p
        raise KeyError(
            f"no pipeline {pipeline_id!r} in the summary; have {[p.pipeline_id for p in self.summary.pipelines]}"
        )


def _baseline(baseline: Any) -> List[Any]:
    """A baseline file path, a list of expectation mappings, or None."""
    import os

    if baseline is None:
        return []
    if isinstance(baseline, (str, os.PathLike)):
        from simulators.verdict.baseline import read_baseline

        return read_baseline(str(baseline), "baseline")
    from harness.logs.expect import parse_expectations
    from harness.logs.invariants import CHECKS

    return parse_expectations(
        list(baseline), "baseline", lambda where, problem: ValueError(f"{where}: {problem}"), CHECKS
    )


def run(
    scenario: Any = None,
    *,
    overrides: Optional[Mapping[str, Any]] = None,
    seed: Optional[int] = None,
    out_dir: Optional[str] = None,
    png: bool = False,
    explore: Optional[int] = None,
    explore_strategy: str = "pct",
    baseline: Any = None,
    upstream_as_findings: bool = False,
) -> SimRun:
    """Simulate and check a scenario; with ``out_dir`` also write its run folder; with
    ``explore`` (a seed) same-time events are ordered by that schedule seed; ``baseline``
    adds expectations to the scenario's ``expect:`` list, and known upstream behaviour is
    apart from ``.unexpected`` as in every command (unless ``upstream_as_findings``)."""
    from harness.logs.known_upstream import upstream_expectations

    import dataclasses

    from harness.logs.outputs.summary import summarize
    from simulators.run import simulate

    spec = load(scenario, overrides)
    if seed is not None:
        spec = dataclasses.replace(spec, seed=seed)
    from simulators.runtime.explore import ExploreSpec

    out = simulate(
        spec,
        out_dir,
        png=png,
        explore=None if explore is None else ExploreSpec(explore, explore_strategy),
        baseline=_baseline(baseline) + upstream_expectations(upstream_as_findings),
    )
    return SimRun(
        spec, out.result, out.violations, summarize(out.result.records), out.summary, out_dir, out.files, out.verdict
    )


@pytest.fixture
def rlharness_scenario():
    """``rlharness_scenario(scenario=None, *, overrides=None)`` -> validated Scenario."""
    return load


@pytest.fixture
def rlharness_run(tmp_path):
    """``rlharness_run(scenario=None, *, overrides=None, seed=None, write=False, png=False, explore=None,
    baseline=None, upstream_as_findings=False)`` -> SimRun."""

    def _run(
        scenario: Any = None,
        *,
        overrides: Optional[Mapping[str, Any]] = None,
        seed: Optional[int] = None,
        write: bool = False,
        png: bool = False,
        explore: Optional[int] = None,
        explore_strategy: str = "pct",
        baseline: Any = None,
        upstream_as_findings: bool = False,
    ) -> SimRun:
        return run(
            scenario,
            overrides=overrides,
            seed=seed,
            out_dir=str(tmp_path / "run") if write else None,
            png=png,
            explore=explore,
            explore_strategy=explore_strategy,
            baseline=baseline,
            upstream_as_findings=upstream_as_findings,
        )

    return _run
