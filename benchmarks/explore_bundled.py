"""Schedule seeds over the bundled scenarios: which findings does exploration add to the
fixed order? (A printed figure for docs/exploration.md, not a test; CPU-heavy: run it niced.)

For each bundled scenario (the 1024-GPU one left out) the fixed order's outcome first --
its signature (``simulators/fuzz/signature.py``: the first violated check or the record that
ended the run) and the set of every check it violates --, then ``--seeds`` schedule seeds
under each strategy. An explored run is new when its signature differs from the fixed
order's or it violates a check the fixed order does not; each is listed with the command
that shows it.

    python benchmarks/explore_bundled.py [--seeds 100] [--strategies pct,random] [--only NAME...] [--json OUT]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def outcome(scenario, explore):
    """(signature, every check the run violates, the log's sha256 without its header) of one run."""
    from harness.logs.invariants import check_log
    from simulators.fuzz.seed_run import lines_sha256
    from simulators.fuzz.signature import signature
    from simulators.runtime.simulation import Simulation

    result = Simulation(scenario, explore=explore).run()
    records = result.records
    violations = check_log(records)
    return (
        signature(records, violations, {p.name: p.type for p in scenario.pipelines}),
        frozenset(v.invariant for v in violations),
        lines_sha256(list(result.log.lines())[1:]),
    )


def main() -> None:
    from simulators.runtime.explore import ExploreSpec
    from simulators.scenario.loader import load_scenario

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100, help="schedule seeds per strategy and scenario")
    ap.add_argument("--strategies", default="pct,random")
    ap.add_argument("--only", nargs="*", help="scenario file names (without .yaml) to run, default all")
    ap.add_argument("--json", help="write every scenario's figures here")
    args = ap.parse_args()
    paths = sorted(p for p in glob.glob(os.path.join(ROOT, "examples", "scenarios", "*.yaml")) if "1024" not in p)
    if args.only:
        paths = [p for p in paths if os.path.basename(p)[:-5] in args.only]
    out = {}
    t_all = time.perf_counter()
    for path in paths:
        name = os.path.basename(path)[:-5]
        scenario = load_scenario(path)
        t0 = time.perf_counter()
        fixed, fixed_checks, fixed_log = outcome(scenario, None)
        new = defaultdict(list)  # (strategy, what is new) -> schedule seeds
        runs, logs = 0, {fixed_log}
        for strategy in args.strategies.split(","):
            for seed in range(args.seeds):
                sig, checks, log = outcome(scenario, ExploreSpec(seed, strategy))
                runs += 1
                logs.add(log)
                extra = sorted(checks - fixed_checks)
                if sig != fixed or extra:
                    new[(strategy, sig + (f" (also {', '.join(extra)})" if extra else ""))].append(seed)
        wall = time.perf_counter() - t0
        out[name] = {
            "fixed": fixed,
            "fixed_checks": sorted(fixed_checks),
            "runs": runs,
            "wall_s": round(wall, 1),
            "distinct_logs": len(logs),
            "new": [
                {
                    "strategy": st,
                    "signature": sig,
                    "seeds": seeds,
                    "reproduce": f"rlharness simulate examples/scenarios/{name}.yaml --explore {seeds[0]} "
                    f"--explore-strategy {st}",
                }
                for (st, sig), seeds in sorted(new.items())
            ],
        }
        print(
            f"{name}: fixed order {fixed}; {runs} explored runs in {wall:.1f} s, {len(logs)} distinct logs "
            f"(the fixed order's included); "
            f"{sum(len(s) for s in new.values())} new (another signature or another violated check)",
            flush=True,
        )
        for item in out[name]["new"]:
            print(
                f"    {item['strategy']:<6} {item['signature']}  x{len(item['seeds'])}  e.g. {item['reproduce']}",
                flush=True,
            )
    print(f"total {time.perf_counter() - t_all:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
