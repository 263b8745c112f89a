"""How fast each exploration strategy finds each field-report scenario's bug (printed figures).

For every field-report scenario (examples/scenarios/wsg_*.yaml, docs/exploration.md#field-reports)
and every strategy (random, pct), runs schedule seeds 0..N-1 and prints the first seed
whose run has the scenario's finding (``deadlock`` or ``lost_wakeup``), how many of the N
seeds have it, and whether the fixed order (no ``--explore``) has it. For each fixed
variant it prints how many of the N seeds have any finding of the wait-for graph and
liveness checks (it should be none).

    python benchmarks/explore_find_rate.py [--seeds 200] [--sweep-bundled K]

``--sweep-bundled K`` also runs seeds 0..K-1 of both strategies over every other bundled
scenario (the 1024-GPU one excepted) and prints each new wait-for or liveness finding.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

BUGS = {  # scenario -> the finding that shows its bug
    "wsg_slime2331_opposite_arrival": "deadlock",
    "wsg_vime329_slot_overwrite": "deadlock",
    "wsg_trl6913_receiver_died": "lost_wakeup",
}
FIXES = ("wsg_slime2331_phased", "wsg_vime329_per_group", "wsg_trl6913_broadcast_timeout")
NEW_CHECKS = ("deadlock", "lost_wakeup", "hot_state", "livelock")


def findings(path: str, seed, strategy: str):
    from harness.invariants import check_log
    from simulators.explore import ExploreSpec
    from simulators.runtime import Simulation
    from simulators.scenario import load_scenario

    explore = None if seed is None else ExploreSpec(seed, strategy)
    result = Simulation(load_scenario(path), explore=explore).run()
    return check_log(result.records, NEW_CHECKS)


def scenario_path(name: str) -> str:
    return os.path.join(ROOT, "examples", "scenarios", name + ".yaml")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--sweep-bundled", type=int, default=0, metavar="K")
    args = ap.parse_args(argv)
    n = args.seeds
    t0 = time.perf_counter()
    print(f"{'scenario':34s} {'strategy':8s} {'fixed order':12s} {'first seed':>10s} {'found in':>12s}")
    for name, check in BUGS.items():
        fixed = any(v.invariant == check for v in findings(scenario_path(name), None, ""))
        for strategy in ("random", "pct"):
            hits = [s for s in range(n) if any(v.invariant == check for v in findings(scenario_path(name), s, strategy))]
            first = str(hits[0]) if hits else "-"
            print(f"{name:34s} {strategy:8s} {('found' if fixed else 'clean'):12s} {first:>10s} "
                  f"{len(hits):>5d}/{n} ({100.0 * len(hits) / n:.0f}%)")
    for name in FIXES:
        for strategy in ("random", "pct"):
            bad = [s for s in range(n) if findings(scenario_path(name), s, strategy)]
            print(f"{name:34s} {strategy:8s} fixed variant: {len(bad)}/{n} seeds with a finding of {', '.join(NEW_CHECKS)}")
    if args.sweep_bundled:
        skip = set(BUGS) | set(FIXES) | {"large_1024gpu"}
        runs = 0
        for path in sorted(glob.glob(os.path.join(ROOT, "examples", "scenarios", "*.yaml"))):
            name = os.path.splitext(os.path.basename(path))[0]
            if name in skip:
                continue
            base = {(v.invariant, v.message) for v in findings(path, None, "")}
            for strategy in ("random", "pct"):
                for s in range(args.sweep_bundled):
                    runs += 1
                    for v in findings(path, s, strategy):
                        if (v.invariant, v.message) not in base:
                            print(f"  NEW {name} --explore {s} --explore-strategy {strategy}: {v}")
        print(f"swept {runs} explored runs of the other bundled scenarios for {', '.join(NEW_CHECKS)}")
    print(f"wall {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
