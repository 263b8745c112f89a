"""``rlharness fuzz``: the command behind a sweep (arguments, progress, table, exit code).

Exit codes: 0 when every signature found is expected by ``--baseline`` (or none was found),
1 when a signature no expectation covers appeared (a finding) or, under ``--strict``, when
an expectation matched no seed; 2 on bad arguments (a bad baseline file included).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from harness.logs.writer import atomic_write
from harness.exit_codes import ExitCode

MAX_SEEDS = 1_000_000
MAX_WORKERS = 256
MAX_EXPLORE = 100_000


def add_parser(sub, usage_error: Callable[[str], Exception]) -> None:
    fz = sub.add_parser("fuzz", help="swarm-test the simulator: one generated scenario and fault mix per seed")
    fz.add_argument("--seeds", type=int, required=True, metavar="N", help="how many seeds to run")
    fz.add_argument("--start", type=int, default=0, metavar="S", help="first seed (default 0)")
    where = fz.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, metavar="K", help="local worker processes (default: CPU count)")
    where.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the seeds as tasks on a Ray cluster ('auto', ray://HOST:PORT, or 'local' for a local Ray)",
    )
    fz.add_argument("--ray-cpus", type=int, metavar="K", help="CPUs of a --ray local instance (default: CPU count)")
    fz.add_argument(
        "--out",
        metavar="DIR",
        default=os.path.join("runs", "fuzz"),
        help="results.json, signatures.txt and minimized/ go here (default runs/fuzz)",
    )
    fz.add_argument(
        "--check-determinism",
        action="store_true",
        help="run each seed again in a fresh process under another PYTHONHASHSEED; a divergence is a finding",
    )
    fz.add_argument(
        "--time-budget",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="wall seconds one seed may take before it is recorded as 'timeout' (default 120)",
    )
    fz.add_argument(
        "--baseline",
        "--expect",
        dest="baseline",
        metavar="FILE",
        help="expected findings (docs/expected-findings.md; e.g. examples/fuzz/known-findings.yaml); "
        "other signatures exit 1 (--expect: the same, its old name)",
    )
    fz.add_argument("--strict", action="store_true", help="exit 1 also when an expected finding occurred in no seed")
    fz.add_argument("--no-minimize", action="store_true", help="skip writing minimized reproducers")
    fz.add_argument(
        "--upstream-as-findings",
        action="store_true",
        help="known upstream behaviour (docs/expected-findings.md) names a signature too; by default a "
        "seed that hits only that is clean",
    )
    fz.add_argument(
        "--explore",
        type=int,
        default=0,
        metavar="K",
        help="also run each seed under schedule seeds 0..K-1 (docs/exploration.md); runs of one seed "
        "that differ only by schedule are one family, 'schedule-only' when the fixed order misses it",
    )
    fz.add_argument(
        "--explore-strategy",
        choices=["pct", "random"],
        default="pct",
        help="with --explore: pct (priority change points, default) or random (a random walk)",
    )
    fz.add_argument("--quiet", action="store_true", help="no progress line")


def _validate(args: argparse.Namespace, usage_error) -> None:
    if not 1 <= args.seeds <= MAX_SEEDS:
        raise usage_error(f"--seeds: must be between 1 and {MAX_SEEDS}, got {args.seeds}")
    if not 0 <= args.start <= 2**63 - 1 - args.seeds:
        raise usage_error(f"--start: must be >= 0 and leave room for --seeds, got {args.start}")
    for flag, value in (("--workers", args.workers), ("--ray-cpus", args.ray_cpus)):
        if value is not None and not 1 <= value <= MAX_WORKERS:
            raise usage_error(f"{flag}: must be between 1 and {MAX_WORKERS}, got {value}")
    if args.ray_cpus is not None and args.ray != "local":
        raise usage_error("--ray-cpus: only with --ray local (a cluster has its own CPUs)")
    if not 0 <= args.explore <= MAX_EXPLORE:
        raise usage_error(f"--explore: must be between 0 and {MAX_EXPLORE} schedule seeds, got {args.explore}")
    if args.seeds * (args.explore + 1) > MAX_SEEDS:
        raise usage_error(
            f"--explore: --seeds x (K + 1) runs must stay within {MAX_SEEDS}, got {args.seeds * (args.explore + 1)}"
        )
    if not 0 < args.time_budget <= 86400:
        raise usage_error(f"--time-budget: must be in (0, 86400] seconds, got {args.time_budget:g}")
    from harness.logs.outputs.paths import OutputPathError, check_output_dir

    try:  # the folder must take files before any seed runs (a read-only place, /proc, /sys)
        check_output_dir(args.out, ["results.json", "signatures.txt"], "--out", inputs=[args.baseline])
    except OutputPathError as e:
        raise usage_error(str(e)) from None


def cmd_fuzz(args: argparse.Namespace, usage_error) -> int:
    from simulators.verdict.baseline import BaselineError, read_baseline
    from simulators.fuzz.sweep import Progress, SweepConfig, format_table, results_json, run_sweep

    _validate(args, usage_error)
    try:
        expect = read_baseline(args.baseline)
    except BaselineError as e:
        raise usage_error(str(e)) from None
    cpus = os.cpu_count() or 1
    cfg = SweepConfig(
        seeds=args.seeds,
        start=args.start,
        workers=args.workers or args.ray_cpus or cpus,
        ray_address=args.ray,
        out_dir=args.out,
        check_determinism=args.check_determinism,
        time_budget_s=args.time_budget,
        expect=expect,
        explore=args.explore,
        explore_strategy=args.explore_strategy,
        upstream_as_findings=args.upstream_as_findings,
    )
    os.makedirs(args.out, exist_ok=True)
    if not args.quiet:
        where = f"Ray at {args.ray}" if args.ray else f"{cfg.workers} local worker(s)"
        print(
            f"fuzzing seeds {cfg.start}..{cfg.start + cfg.seeds - 1} on {where}"
            + (
                f", each in the fixed order and under {cfg.explore} {cfg.explore_strategy} schedule seed(s)"
                if cfg.explore
                else ""
            )
            + (", each checked for determinism" if cfg.check_determinism else ""),
            file=sys.stderr,
        )
    sweep = run_sweep(cfg, None if args.quiet else Progress(len(cfg.runs())), minimize_findings=not args.no_minimize)
    atomic_write(os.path.join(args.out, "results.json"), results_json(sweep.results))
    table = format_table(sweep)
    atomic_write(os.path.join(args.out, "signatures.txt"), table + "\n")
    print(table)
    print(f"results: {os.path.join(args.out, 'results.json')}")
    if sweep.unexpected:
        print(
            f"{len(sweep.unexpected)} signature(s) no expectation covers"
            + (f" (baseline {args.baseline})" if args.baseline else " (none given: --baseline FILE)")
        )
        return ExitCode.FINDING
    if args.strict and sweep.not_found:
        print(f"{len(sweep.not_found)} expected finding(s) occurred in no seed (--strict)")
        return ExitCode.FINDING
    return ExitCode.OK
