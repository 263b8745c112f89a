"""Schedule seeds in a sweep (``rlharness fuzz --explore K``): which findings only a schedule gives.

With ``--explore K`` every scenario seed runs K + 1 times: the fixed same-time order, then
schedule seeds 0..K-1 under one strategy (``simulators/runtime/explore.py``). Runs of one scenario
seed that end with the same signature differ only by schedule: they are one *family*. A
family is ``schedule-only`` when the fixed order of its scenario seed does not end with that
signature (only another interleaving reaches it), else ``fixed-order`` (the fixed order has it
too; the schedules add nothing). A result records its family (``family``), and a finding
counts its families and names the schedule-only ones, so the table says how many distinct
findings a sweep made once runs that differ only by schedule are put together.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from simulators.fuzz.signature import CLEAN

Result = Dict[str, Any]
SCHEDULE_ONLY = "schedule-only"
FIXED_ORDER = "fixed-order"


def run_key(r: Result) -> Tuple[int, int]:
    """A run's place in results.json: by scenario seed, the fixed order (-1) first, then
    the schedule seeds (one strategy per sweep)."""
    explore = r.get("explore")
    return r["seed"], -1 if explore is None else explore["seed"]


def mark_families(results: List[Result]) -> None:
    """Add ``family`` to every explored run with a finding (an unexplored sweep's results
    are left as they were)."""
    fixed = {r["seed"]: r["signature"] for r in results if "explore" not in r}
    for r in results:
        if "explore" in r and r["signature"] != CLEAN:
            r["family"] = FIXED_ORDER if fixed.get(r["seed"]) == r["signature"] else SCHEDULE_ONLY


def families(runs: List[Result]) -> Tuple[int, List[int]]:
    """(how many scenario seeds, those whose family is schedule-only) among one signature's runs."""
    seeds = {r["seed"] for r in runs}
    only = sorted(s for s in seeds if all(r.get("family") == SCHEDULE_ONLY for r in runs if r["seed"] == s))
    return len(seeds), only


def explore_flags(explore: Optional[Dict[str, Any]]) -> str:
    """The flags a reproducer command needs for this schedule ('' for the fixed order)."""
    if explore is None:
        return ""
    return f" --explore {explore['seed']} --explore-strategy {explore['strategy']}"


def schedule_only_lines(findings: List[Any], results: List[Result], scenario_file: Callable[[int], str]) -> List[str]:
    """The table's section on schedule-only families: per finding, each scenario seed, the
    schedule seeds that reach it (the fixed order of that seed does not) and the command
    that shows it (``scenario_file(seed)``: where the seed's scenario is written)."""
    lines = []
    for f in findings:
        for seed in f.schedule_only:
            runs = [
                r["explore"] for r in results if r["seed"] == seed and r["signature"] == f.signature and "explore" in r
            ]
            shown = ", ".join(str(x["seed"]) for x in runs[:8]) + (", ..." if len(runs) > 8 else "")
            lines.append(
                f"  {f.signature}  seed {seed}: schedule seed(s) {shown} ({len(runs)} of the sweep's "
                f"schedules): rlharness simulate {scenario_file(seed)}{explore_flags(runs[0])}"
            )
    if lines:
        lines.insert(0, "schedule-only families (the fixed order of that scenario seed ends otherwise):")
    return lines
