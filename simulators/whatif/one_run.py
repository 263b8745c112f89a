"""One run of a sweep: simulate a variant with a seed, check it, keep the figures.

A top-level function of plain arguments, so the local executor (a forked child) and a Ray
task run the same thing; it returns only what the comparison needs, never wall times, so
``results.json`` holds the same bytes whichever executor ran it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Dict

from simulators.runtime.gc_pause import gc_paused
from harness.logs.invariants import check_log
from harness.ordered_sum import ordered_sum
from harness.logs.outputs.policy_figures import policy_figures
from harness.logs.outputs.run_view import RunView
from harness.logs.outputs.summary import summarize
from harness.logs.outputs.summary_text import summary_json


def run_one(
    job_id: int, variant: int, mapping: dict, source: str, seed: int, upstream_as_findings: bool = False
) -> Dict[str, Any]:
    """One variant and seed; known upstream behaviour (harness.logs.known_upstream) is counted
    apart, as ``known:<check>``, unless ``upstream_as_findings``."""
    from harness.logs.known_upstream import BY_NAME, split_known
    from simulators.runtime.simulation import Simulation
    from simulators.scenario.loader import scenario_from_mapping

    scenario = dataclasses.replace(scenario_from_mapping(mapping, source), seed=seed)
    result = Simulation(scenario).run()
    with gc_paused():
        violations = check_log(result.records)
        figures = summary_json(
            summarize(RunView(result.records), handover_findings=[v for v in violations if v.invariant == "handover"])
        )
        policy = policy_figures(result.records, figures)
        found = Counter(v.invariant for v in violations)
        if not upstream_as_findings:
            rest, known = split_known(violations, result.records, {p.name: p.type for p in scenario.pipelines})
            found = Counter(v.invariant for v in rest)
            for name, n in known.items():
                found[f"known:{BY_NAME[name].check}"] += n
    return {
        "seed": job_id,
        "status": "ok",
        "variant": variant,
        "run_seed": seed,
        **run_figures(figures, result.reason, found),
        **policy,
    }


def run_figures(summary: Dict[str, Any], end: str, findings: Counter) -> Dict[str, Any]:
    """The figures a sweep compares, out of one run's summary.json mapping."""
    refit_by = {r["pipeline_id"]: r["total_sync_s"] for r in summary.get("refit", [])}
    ages = summary.get("staleness_by_pipeline", {})
    pipelines = {}
    for p in summary["pipelines"]:
        pid = p["pipeline_id"]
        hist = {int(a): n for a, n in ages.get(pid, {}).items()}
        n = sum(hist.values())
        pipelines[pid] = {
            "steps_done": p["steps_done"],
            "step_times": p["step_times"],
            "refit_s": refit_by.get(pid, 0.0),
            "waiting_s": p["waiting_s"],
            "mean_age_steps": (ordered_sum(a * k for a, k in sorted(hist.items())) / n) if n else None,
        }
    shares = summary["gpus_all"]
    return {
        "end": end,
        "simulated_s": summary["run"]["simulated_s"],
        "busy_pct": 100.0 - shares["idle_pct"],
        "idle_pct": shares["idle_pct"],
        "pipelines": pipelines,
        "findings": dict(sorted(findings.items())),
    }
