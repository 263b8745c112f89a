"""``rlharness sweep``: a grid of ``--set`` values x seeds, one comparison.

Exit codes: 0 when every run finished (findings are figures here, shown per variant),
1 when a run crashed or went over its time budget, 2 on bad arguments (every variant is
validated before the first run).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, List

from harness.logs.writer import atomic_write
from harness.exit_codes import ExitCode

MAX_WORKERS = 256
SWEEP_FILES = ("results.json", "table.txt", "sweep.png")


def add_parser(sub, usage_error: Callable[[str], Exception]) -> None:
    sw = sub.add_parser("sweep", help="what-if: run a grid of --set values x seeds and compare the runs")
    sw.add_argument("scenario", metavar="SCENARIO", nargs="?", help="scenario YAML (default: the default scenario)")
    sw.add_argument(
        "--set",
        dest="axes",
        metavar="PATH=V1,V2,...",
        action="append",
        default=[],
        help="a field and its values (pipelines[0].infer_tp=1,2); repeatable: the grid is every combination",
    )
    sw.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="K",
        help="seeds per variant: the scenario's seed and the K-1 after it (default 1)",
    )
    where = sw.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, metavar="N", help="local worker processes (default: CPU count)")
    where.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster ('auto', ray://HOST:PORT, or 'local')")
    sw.add_argument("--out", metavar="DIR", help="results.json, table.txt and sweep.png (default runs/sweep-<name>)")
    sw.add_argument(
        "--time-budget",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="wall seconds one run may take before it is recorded as 'timeout' (default 600)",
    )
    sw.add_argument("--no-png", action="store_true", help="skip the comparison plot")
    sw.add_argument("--quiet", action="store_true", help="no progress lines")
    sw.add_argument(
        "--upstream-as-findings",
        action="store_true",
        help="count known upstream behaviour with the findings (by default it is listed as known:<check>)",
    )


def add_what_if_parser(sub) -> None:
    wi = sub.add_parser(
        "what-if",
        help="what-if: one workload recast into other shapes (colocate: colocated, "
        "partial overlap, one step off, fully async)",
    )
    wsub = wi.add_subparsers(dest="what_if", metavar="QUESTION")
    co = wsub.add_parser(
        "colocate",
        help="the scenario's one pipeline as colocated, RLix partial overlap, "
        "disaggregated one step off and fully async, side by side (docs/what-if.md)",
    )
    co.add_argument("scenario", metavar="SCENARIO", help="scenario YAML with one pipeline (the workload)")
    co.add_argument(
        "--out", metavar="DIR", help="table.txt, results.json and colocate.png (default runs/colocate-<name>)"
    )
    co.add_argument("--no-png", action="store_true", help="skip the picture")


def cmd_what_if(args: argparse.Namespace, usage_error) -> int:
    """``what-if colocate``: every variant is built and validated before any runs."""
    from harness.logs.outputs.paths import check_output_dir
    from simulators.scenario.loader import ScenarioError, read_mapping, scenario_from_mapping
    from simulators.whatif import colocate

    if args.what_if != "colocate":
        raise usage_error("what-if: a question is required (colocate); see rlharness what-if --help")
    try:
        mapping = read_mapping(args.scenario)
        if not isinstance(mapping, dict):
            raise usage_error(f"{args.scenario}: a scenario is a mapping")
        for m in colocate.variants(mapping):
            scenario_from_mapping(m, f"{args.scenario} as {m['name']}")
    except colocate.ColocateError as e:
        raise usage_error(f"{args.scenario}: {e}") from None
    except ScenarioError as e:
        raise usage_error(str(e)) from None
    name = str(mapping.get("name", "scenario"))
    out_dir = args.out or os.path.join("runs", f"colocate-{name}")
    check_output_dir(out_dir, colocate.FILES, "--out" if args.out else "what-if folder", inputs=[args.scenario])
    rows = colocate.compare(mapping, args.scenario)
    pipe = mapping["pipelines"][0]
    gpus = len(set(pipe.get("train_gpus", [])) | set(pipe.get("infer_gpus", [])))
    print(colocate.write(out_dir, args.scenario, rows, gpus, not args.no_png))
    print(f"results: {os.path.join(out_dir, 'results.json')}")
    return 0 if all(r["end"] == "done" for r in rows) else 1


def _validate(args: argparse.Namespace, usage_error) -> None:
    if not 1 <= args.seeds <= 10_000:
        raise usage_error(f"--seeds: must be between 1 and 10000, got {args.seeds}")
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise usage_error(f"--workers: must be between 1 and {MAX_WORKERS}, got {args.workers}")
    if not 0 < args.time_budget <= 86400:
        raise usage_error(f"--time-budget: must be in (0, 86400] seconds, got {args.time_budget:g}")


def cmd_sweep(args: argparse.Namespace, usage_error) -> int:
    from harness.logs.outputs.paths import check_output_dir
    from simulators.scenario.overrides import OverrideError
    from simulators.scenario.loader import ScenarioError
    from simulators.whatif.compare import aggregate, draw, format_table, results_json
    from simulators.whatif.grid import MAX_RUNS, build_grid, parse_axis

    _validate(args, usage_error)
    try:
        axes = [parse_axis(t) for t in args.axes]
        variants, source = build_grid(args.scenario, axes)
    except (OverrideError, ScenarioError) as e:
        raise usage_error(str(e)) from None
    if len(variants) * args.seeds > MAX_RUNS:
        raise usage_error(f"--set/--seeds: {len(variants)} variant(s) x {args.seeds} seed(s) is over {MAX_RUNS} runs")
    name = str(variants[0].mapping.get("name", "scenario"))
    out_dir = args.out or os.path.join("runs", f"sweep-{name}")
    check_output_dir(out_dir, SWEEP_FILES, "--out" if args.out else "sweep folder", inputs=[args.scenario])
    base_seed = int(variants[0].mapping.get("seed", 0) or 0)
    seeds = [base_seed + k for k in range(args.seeds)]
    jobs = _jobs(variants, seeds, source, args.upstream_as_findings)
    workers = args.workers or os.cpu_count() or 1
    if not args.quiet:
        where = f"Ray at {args.ray}" if args.ray else f"{workers} local worker(s)"
        print(
            f"sweeping {name!r}: {len(variants)} variant(s) x {len(seeds)} seed(s) = {len(jobs)} run(s) on {where}",
            file=sys.stderr,
        )
    runs = _run(jobs, args, workers, variants)
    agg = aggregate(variants, runs)
    header = {
        "scenario": name,
        "source": source,
        "seeds": seeds,
        "grid": [{"path": a.path, "values": list(a.values)} for a in axes],
    }
    os.makedirs(out_dir, exist_ok=True)
    atomic_write(os.path.join(out_dir, "results.json"), results_json(header, agg, runs))
    table = format_table(agg, len(seeds))
    atomic_write(os.path.join(out_dir, "table.txt"), table + "\n")
    if not args.no_png:
        draw(agg, os.path.join(out_dir, "sweep.png"), f"{name}: {len(variants)} variant(s) x {len(seeds)} seed(s)")
    print(table)
    print(f"results: {os.path.join(out_dir, 'results.json')}")
    failed = [r for r in runs if r["status"] != "ok"]
    if failed:
        print(
            f"{len(failed)} run(s) did not finish: "
            + "; ".join(
                f"v{r.get('variant')} seed {r.get('run_seed')}: {r['status']} ({r.get('detail', '')})"
                for r in failed[:5]
            )
        )
        return ExitCode.FINDING
    return ExitCode.OK


def _jobs(variants, seeds: List[int], source: str, upstream_as_findings: bool = False):
    from simulators.fuzz.executors import Job
    from simulators.whatif.one_run import run_one

    jobs = []
    for v in variants:
        for s in seeds:
            job_id = len(jobs)
            jobs.append(
                Job(
                    job_id,
                    run_one,
                    (job_id, v.index, v.mapping, f"{source} with --set {v.label}", s, upstream_as_findings),
                )
            )
    return jobs


def _run(jobs, args: argparse.Namespace, workers: int, variants) -> List[dict]:
    from simulators.fuzz.executors import run_isolated, run_on_ray

    where = {j.seed: (j.args[1], j.args[4]) for j in jobs}
    if args.ray:
        results = run_on_ray(jobs, address=args.ray, workers=workers, budget=args.time_budget)
    else:
        results = run_isolated(jobs, workers=workers, budget=args.time_budget, clock=time.monotonic)
    runs = []
    for res in results:
        variant, seed = where[res["seed"]]
        res.setdefault("variant", variant)
        res.setdefault("run_seed", seed)
        runs.append(res)
        if not args.quiet:
            print(
                f"  [{len(runs)}/{len(jobs)}] v{variant} ({variants[variant].label}) seed {seed}: "
                f"{res.get('end', res['status'])}",
                file=sys.stderr,
            )
    return runs
