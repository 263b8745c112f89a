"""Simulation speed of this checkout against another one, measured back to back.

The machine this project is developed on is shared and its load swings from 1 to 13, so
a wall time measured now cannot be set against one measured an hour ago. This runs one
scenario in fresh processes of both checkouts, alternating, and reports the best CPU time
(``time.process_time``) of ``Simulation(scenario).run()`` per checkout and their ratio:
a before/after figure that load shifts much less than wall time.

    git worktree add /tmp/before main   # or: git archive main | tar -x -C /tmp/before
    python benchmarks/sim_compare.py /tmp/before [--scenario examples/scenarios/mixed_64gpu.yaml]
        [--rounds 3] [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

_CHILD = r"""
import gc, json, sys, time
sys.path.insert(0, ".")
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario
from simulators.scenario.spec import default_scenario
scenario = load_scenario(sys.argv[1])
Simulation(default_scenario()).run()  # warm-up: imports and first calls are not the run's
best = float("inf")
for _ in range(int(sys.argv[2])):
    gc.collect()
    t0 = time.process_time()
    result = Simulation(scenario).run()
    best = min(best, time.process_time() - t0)
print(json.dumps([best, result.sim_time]))
"""


def best_cpu(checkout: str, scenario: str, runs: int) -> "tuple[float, float]":
    """(best CPU seconds of one run, simulated seconds) in a fresh process of ``checkout``."""
    env = dict(os.environ, PYTHONPATH=checkout)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, os.path.abspath(scenario), str(runs)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: {out.stderr.strip()[-500:]}")
    best, sim = json.loads(out.stdout.strip().splitlines()[-1])
    return best, sim


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("other", help="the checkout to compare with (a directory holding simulators/)")
    ap.add_argument("--scenario", default="examples/scenarios/mixed_64gpu.yaml")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two checkouts")
    ap.add_argument("--runs", type=int, default=10, help="runs per process (the best is kept)")
    args = ap.parse_args(argv)
    scenario = os.path.join(ROOT, args.scenario) if not os.path.isabs(args.scenario) else args.scenario
    other, this = [], []
    for _ in range(args.rounds):
        other.append(best_cpu(os.path.abspath(args.other), scenario, args.runs))
        this.append(best_cpu(ROOT, scenario, args.runs))
    o, t, sim = min(x[0] for x in other), min(x[0] for x in this), this[0][1]
    print(
        f"{os.path.basename(scenario)}: other {o:.4f} s CPU ({sim / o:,.0f}x), this {t:.4f} s CPU "
        f"({sim / t:,.0f}x): this is {o / t:.2f}x faster"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
