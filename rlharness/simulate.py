"""``rlharness simulate [SCENARIO]``: one scenario through the simulator, its outputs
written to a run folder as the run goes, the oracle's verdict printed; with
``--check-determinism`` the same run again in a fresh process, compared byte for byte.
"""

from __future__ import annotations

import argparse
import os
import sys

from harness.exit_codes import ExitCode
from harness.logs.expect import report_lines
from harness.logs.outputs.paths import check_output_dir
from rlharness.check import print_violations
from rlharness.options import add_baseline, add_command, read_baseline


def add_parser(sub) -> None:
    sim = add_command(sub, "simulate", "simulate a scenario (default: two nemo_async pipelines on 2 GPUs)")
    sim.add_argument("scenario", metavar="SCENARIO", nargs="?", help="scenario YAML (see examples/scenarios/)")
    sim.add_argument("--seed", type=int, help="override the scenario's seed")
    sim.add_argument(
        "--set",
        dest="overrides",
        metavar="PATH=VALUE",
        action="append",
        default=[],
        help="change one field, written as error messages write it (pipelines[0].infer_tp=2, "
        "costs.wake_s=1.5, pipelines[ppl2].steps=8); repeatable; VALUE is YAML",
    )
    sim.add_argument("--out", metavar="DIR", help="output folder (default: runs/<scenario name>)")
    sim.add_argument(
        "--no-png", action="store_true", help="skip the PNG timeline (an old one in the folder is removed)"
    )
    sim.add_argument(
        "--explore",
        type=int,
        metavar="SEED",
        help="a seeded strategy orders same-time events of different processes and lock hand-offs, "
        "and adds small delays to RPC returns and lock holds (docs/exploration.md)",
    )
    sim.add_argument(
        "--explore-strategy",
        choices=["pct", "random"],
        default="pct",
        help="with --explore: pct (priority change points, default) or random (a random walk)",
    )
    sim.add_argument("--quiet", action="store_true", help="no progress lines, no summary table")
    sim.add_argument(
        "--check-determinism",
        action="store_true",
        help="run again in a fresh process under another PYTHONHASHSEED; exit 1 unless the event logs are byte-identical",
    )
    add_baseline(sim)


def _scenario(args: argparse.Namespace, usage_error):
    """The scenario with its --set overrides and --seed, and the --explore strategy (or None)."""
    from simulators.run import with_seed
    from simulators.scenario.loader import ScenarioError
    from simulators.scenario.overrides import OverrideError, load_with_overrides, parse_override

    try:
        overrides = [parse_override(text) for text in args.overrides]
        scenario = load_with_overrides(args.scenario, overrides)
    except (ScenarioError, OverrideError) as e:
        raise usage_error(str(e)) from None
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise usage_error(f"--seed: must be in 0..2**63-1, got {args.seed}")
    scenario = with_seed(scenario, args.seed)
    explore = None
    if args.explore is not None:
        from simulators.runtime.explore import ExploreSpec

        if not 0 <= args.explore < 2**63:
            raise usage_error(f"--explore: must be in 0..2**63-1, got {args.explore}")
        explore = ExploreSpec(args.explore, args.explore_strategy)
    return scenario, explore


def run(args: argparse.Namespace, usage_error) -> int:
    from simulators.run import OUTPUT_FILES, simulate
    from simulators.runtime.simulation import print_progress

    scenario, explore = _scenario(args, usage_error)
    args.explore_spec = explore
    baseline = read_baseline(args.baseline, args.upstream_as_findings)
    out_dir = args.out or os.path.join("runs", scenario.name)
    check_output_dir(
        out_dir, OUTPUT_FILES, "--out" if args.out else "run folder", inputs=[args.scenario, args.baseline]
    )
    if not args.quiet:
        print(
            f"simulating {scenario.name!r}: {len(scenario.pipelines)} pipeline(s) on {scenario.cluster.num_gpus} GPU(s), "
            f"seed {scenario.seed}, horizon {scenario.horizon_s:g} simulated s",
            file=sys.stderr,
        )
    # the outputs are made as the run goes (memory bounded by what is live: a run larger
    # than memory fits); --check-determinism compares this run's log kept in memory
    out = simulate(
        scenario,
        out_dir,
        png=not args.no_png,
        progress=None if args.quiet else print_progress,
        explore=explore,
        baseline=baseline,
        strict=args.strict,
        stream=not args.check_determinism,
    )
    _print_outcome(out, scenario.name, out_dir, args)
    deterministic = _check_determinism(out.result, args) if args.check_determinism else True
    # a failed run is a finding (oom:..., failed:...) and a horizon stall a liveness
    # violation: both are in the verdict, with the expectations that may cover them
    return ExitCode.OK if not out.verdict.failed(args.strict) and deterministic else ExitCode.FINDING


def _print_outcome(out, name: str, out_dir: str, args: argparse.Namespace) -> None:
    """The run's summary table (unless --quiet), its one-line outcome, and where the outputs are."""
    res = out.result
    if not args.quiet:
        print(out.summary)
    print(
        f"{name}: {res.reason} ({res.detail}); simulated {res.sim_time:.1f} s in {res.wall_s:.2f} s wall, "
        f"{res.events} events, {res.log.made} records; invariants: "
        + ("all hold" if not out.violations else f"{len(out.violations)} violation(s)")
        + (
            f"; findings: {len(out.verdict.unexpected)} unexpected, {len(out.verdict.expected)} expected or known"
            if out.verdict.reported
            else ""
        )
    )
    if out.figures is not None and out.figures.headroom is not None:
        from harness.logs.outputs.headroom import headroom_brief

        print(headroom_brief(out.figures.headroom))
    if not out.verdict.reported:
        print_violations(out.violations, f"all in {os.path.join(out_dir, 'violations.txt')}")
    elif args.quiet:  # the summary (not printed) holds these lines otherwise
        for line in report_lines(out.verdict, args.strict):
            print(line)
    print(f"outputs: {out_dir}/ ({', '.join(os.path.basename(f) for f in out.files)})")


def _check_determinism(res, args: argparse.Namespace) -> bool:
    from simulators.selfcheck.determinism import check_determinism

    if not args.quiet:
        print("checking determinism: the same run again in a fresh process", file=sys.stderr)
    try:
        check = check_determinism(res, args.scenario, resolved=bool(args.overrides), explore=args.explore_spec)
    except RuntimeError as e:
        print(f"determinism: NOT CHECKED: {e}")
        return False
    where = f"a fresh process (PYTHONHASHSEED={check.hash_seed})"
    div = check.divergence
    if div is None:
        print(f"determinism: {check.records} records byte-identical in {where}")
        return True
    print(f"determinism: DIVERGED in {where} at events.jsonl line {div.line}:")
    print(f"  this run:  {div.ours if div.ours is not None else '<log ended>'}")
    print(f"  fresh run: {div.theirs if div.theirs is not None else '<log ended>'}")
    return False
