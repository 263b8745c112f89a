"""Schedule exploration's cost per run against the fixed order (a printed figure, not a test).

Runs the 64-GPU scenario and the default one with the fixed same-time order, then with
``--explore`` under each strategy (a few seeds), interleaved; prints the best CPU time of
each and the ratio to the fixed order, and the best CPU time per simulated event (an explored
seed runs another interleaving, and its seeded delays add events: per event is the
exploration's own cost).

    python benchmarks/explore_overhead.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> None:
    from simulators.runtime.explore import ExploreSpec
    from simulators.runtime.simulation import Simulation
    from simulators.scenario.loader import load_scenario
    from simulators.scenario.spec import default_scenario

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cases = [
        ("default", default_scenario()),
        ("mixed_64gpu", load_scenario(os.path.join(ROOT, "examples", "scenarios", "mixed_64gpu.yaml"))),
    ]
    variants = [("fixed order", None), ("pct", "pct"), ("random", "random")]
    print(f"load {os.getloadavg()[0]:.2f}; best of {args.repeats} interleaved rounds (explored rounds use seeds 0..)")
    for name, scenario in cases:
        best = {v: float("inf") for v, _ in variants}
        per_event = {v: float("inf") for v, _ in variants}  # an explored seed may run more events (delays)
        for r in range(args.repeats):
            for label, strategy in variants:
                explore = None if strategy is None else ExploreSpec(r, strategy)
                t = time.process_time()  # CPU time: on a shared, loaded machine far steadier than wall time
                res = Simulation(scenario, explore=explore).run()
                wall = time.process_time() - t
                best[label] = min(best[label], wall)
                per_event[label] = min(per_event[label], wall / max(1, res.events))
        base, base_ev = best["fixed order"], per_event["fixed order"]
        print(
            f"{name:12} "
            + "  ".join(
                f"{label} {best[label] * 1e3:7.1f} ms ({best[label] / base:.2f}x, "
                f"{per_event[label] * 1e6:.2f} us/event = {per_event[label] / base_ev:.2f}x)"
                for label, _ in variants
            )
        )


if __name__ == "__main__":
    main()
