"""CPU seconds of each phase of ``rlharness simulate``'s outputs, this checkout against another.

The development machine is shared (its load swings from 1 to 13), so wall times taken at
different moments cannot be compared. This runs the 1024-GPU scenario (or ``--scenario``)
in a fresh process of each checkout, alternating, and reports per phase the CPU time
(``time.process_time``) of that process: the simulation, the invariant check, the summary,
each output file, and the costliest checks one by one — all in one process (no fork: the
split of simulators/verdict/check_fork.py moves work between processes, it saves none). Then the
command line end to end (``rlharness simulate ... --out DIR --quiet``) per checkout: wall
seconds, CPU seconds of it and its children (the forked share included), and the load
average when it started.

    git archive main | tar -x -C /tmp/before
    python benchmarks/output_phases.py /tmp/before [--scenario ...] [--rounds 2] [--checks 12]
    python benchmarks/output_phases.py          # this checkout only
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LARGE = "examples/scenarios/large_1024gpu.yaml"

_CHILD = r"""
import gc, inspect, json, os, sys, tempfile, time
sys.path.insert(0, ".")
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario
import simulators.run as run
from harness.logs.invariants import CHECKS, SEES, kind_views

class _Cpu:  # the stopwatch of write_outputs, reading CPU time instead of wall time
    perf_counter = staticmethod(time.process_time)

scenario = load_scenario(sys.argv[1])
t = time.process_time()
result = Simulation(scenario).run()
phases = {"simulate": time.process_time() - t}
gc.disable()
views = kind_views(result.records, [SEES.get(n) for n in CHECKS])
checks = {}
for name, fn in CHECKS.items():
    t = time.process_time()
    fn(views[SEES.get(name)])
    checks[name] = time.process_time() - t
gc.enable()
run.time = _Cpu
steps = {}
extra = {"fork": False} if "fork" in inspect.signature(run.write_outputs).parameters else {}
with tempfile.TemporaryDirectory() as tmp:
    t = time.process_time()
    run.write_outputs(result, os.path.join(tmp, "run"), timings=steps, **extra)
    phases["outputs"] = time.process_time() - t
phases.update(steps)
print(json.dumps({"phases": phases, "checks": checks, "records": len(result.records)}))
"""


def phases_of(checkout: str, scenario: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, scenario],
        cwd=checkout,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=checkout),
    )
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def end_to_end(checkout: str, scenario: str) -> dict:
    """Wall and CPU seconds (its children's included) of the command line, and the load then."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "rlharness", "simulate", scenario, "--out", os.path.join(tmp, "run"), "--quiet"],
            cwd=checkout,
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=checkout),
        )
        wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):  # 1: findings, every output still written
        raise SystemExit(f"{checkout}: rlharness simulate failed: {proc.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "load": load}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("other", nargs="?", help="a checkout to compare with (a directory holding simulators/)")
    ap.add_argument("--scenario", default=LARGE)
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the checkouts (the least CPU is kept)")
    ap.add_argument("--checks", type=int, default=12, help="how many of the costliest checks to list")
    args = ap.parse_args(argv)
    scenario = args.scenario if os.path.isabs(args.scenario) else os.path.join(ROOT, args.scenario)
    trees = [("this", ROOT)] + ([("other", os.path.abspath(args.other))] if args.other else [])
    best: dict = {}
    runs: dict = {label: [] for label, _ in trees}
    for _ in range(args.rounds):
        for label, tree in reversed(trees):  # the other checkout first in each round
            got = phases_of(tree, scenario)
            mine = best.setdefault(label, {"phases": {}, "checks": {}})
            for part in ("phases", "checks"):
                for name, s in got[part].items():
                    mine[part][name] = min(s, mine[part].get(name, s))
            runs[label].append(end_to_end(tree, scenario))
    labels = [label for label, _ in trees]
    print(f"{os.path.relpath(scenario, ROOT)}: CPU seconds per phase, least of {args.rounds} run(s), one process")
    print(f"  {'phase':<28}" + "".join(f"{label:>10}" for label in labels))
    names = list(best["this"]["phases"]) + [
        n for n in best.get("other", {}).get("phases", {}) if n not in best["this"]["phases"]
    ]
    for name in names:
        print(f"  {name:<28}" + "".join(f"{best[label]['phases'].get(name, float('nan')):>10.2f}" for label in labels))
    print("costliest checks (CPU s, each on its own view):")
    top = sorted(best["this"]["checks"], key=lambda n: -max(best[label]["checks"].get(n, 0.0) for label in labels))
    for name in top[: args.checks]:
        print(f"  {name:<28}" + "".join(f"{best[label]['checks'].get(name, float('nan')):>10.3f}" for label in labels))
    print(f"  {'all checks':<28}" + "".join(f"{sum(best[label]['checks'].values()):>10.2f}" for label in labels))
    print("rlharness simulate ... --out DIR --quiet, end to end (wall s / CPU s with children / load at start):")
    for label in labels:
        print(f"  {label:<6} " + ", ".join(f"{r['wall']:.1f} / {r['cpu']:.1f} / {r['load']:.1f}" for r in runs[label]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
