"""``rlharness validate SCENARIO...``: check scenario files without running them.

Every rule ``rlharness simulate`` applies before it starts (field types, bounds and
units, topology, size limits, the run-folder name) is applied here, nothing is
simulated and nothing is written: the first problem of a file is its one error line
(exit 2), a good file gets one line saying what it would run.
"""

from __future__ import annotations

import argparse

from harness.exit_codes import ExitCode


def add_parser(sub) -> None:
    va = sub.add_parser("validate", help="check scenario files without running them (exit 0 valid, 2 not)")
    va.add_argument("scenarios", metavar="SCENARIO", nargs="+", help="scenario YAML file(s)")


def run(args: argparse.Namespace, usage_error) -> int:
    from simulators.scenario.loader import ScenarioError, load_scenario

    for path in args.scenarios:
        try:
            s = load_scenario(path)
        except ScenarioError as e:
            raise usage_error(str(e)) from None
        steps = sum(p.steps for p in s.pipelines)
        print(
            f"{path}: valid: scenario {s.name!r}, {len(s.pipelines)} pipeline(s) on {s.cluster.num_gpus} GPU(s), "
            f"{steps} step(s) in all, {len(s.faults)} fault(s), seed {s.seed}, horizon {s.horizon_s:g} simulated s"
            + _headroom(s)
        )
    return ExitCode.OK


def _headroom(s) -> str:
    """The static worst-case wake headroom (simulators/scenario/feasibility.py), against the margin."""
    from simulators.scenario.feasibility import static_headroom

    worst = static_headroom(s)
    if worst is None:
        return ""
    gpu, free, what = worst
    margin = s.costs.handover_margin_bytes
    return f"; static worst-case wake headroom {free / (1 << 30):.2f} GiB on {what}" + (
        f" (under the {margin / (1 << 30):.2f} GiB margin)" if free < margin else ""
    )
