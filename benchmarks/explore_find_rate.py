"""How fast each exploration strategy finds each field-report scenario's bug (printed figures).

For every field-report scenario (examples/scenarios/wsg_*.yaml, docs/exploration.md#field-reports)
and every strategy (random, pct), runs schedule seeds 0..N-1 and prints the first seed
whose run has the scenario's finding (``deadlock`` or ``lost_wakeup``), how many of the N
seeds have it, and whether the fixed order (no ``--explore``) has it. For each fixed
variant it prints how many of the N seeds have any finding of the wait-for graph and
liveness checks (it should be none).

    python benchmarks/explore_find_rate.py [--seeds 200] [--sweep-bundled K]

``--depths`` also runs, for every bug, the pct strategy at PCT depths 1..3 (d - 1 change
points among the run's k rankings; k printed) and two more cases: slime #2331 with three
engines (the deadlock needs two engines' opposite orders), and RLix's premature
planned-release ack on ``gap_ratio_3pipelines`` (check ``planned_release_ack``), which no
fixed order of that scenario shows (docs/exploration.md#pct-against-the-random-walk).

``--shapes`` prints, from the explorer alone (no scenario), how often each strategy meets
two ordering shapes between two processes A and B that meet at m instants among 7 others:
"A before B at every one of the m instants" (one constraint that has to hold m times) and
"A before B at the first instant, B before A at the last" (two constraints between the same
two processes: PCT needs a change point between them).

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


def findings(path, seed, strategy: str, depth: int = 3, checks=NEW_CHECKS):
    """The findings of one run of ``path`` (a scenario file, or a loaded Scenario)."""
    from harness.logs.invariants import check_log
    from simulators.runtime.explore import ExploreSpec
    from simulators.runtime.simulation import Simulation
    from simulators.scenario.loader import load_scenario

    explore = None if seed is None else ExploreSpec(seed, strategy, depth=depth)
    scenario = load_scenario(path) if isinstance(path, str) else path
    return check_log(Simulation(scenario, explore=explore).run().records, checks)


def depth_cases():
    """(label, scenario, check) of the depth comparison: the field reports, slime #2331
    with three engines, and RLix's premature planned-release ack."""
    import dataclasses

    from simulators.scenario.loader import load_scenario

    out = [(name, load_scenario(scenario_path(name)), check) for name, check in BUGS.items() if check == "deadlock"]
    slime = out[0][1]
    p0 = slime.pipelines[0]
    three = dataclasses.replace(
        slime,
        pipelines=(dataclasses.replace(p0, weight_sync_groups=dataclasses.replace(p0.weight_sync_groups, engines=3)),),
    )
    out.insert(1, ("wsg_slime2331 with 3 engines", three, "deadlock"))
    out.append(("gap_ratio_3pipelines", load_scenario(scenario_path("gap_ratio_3pipelines")), "planned_release_ack"))
    return out


def depth_table(n: int) -> None:
    """First seed and rate of random and of pct at depths 1..3, with PCT's k per scenario."""
    from simulators.runtime.explore import _PILOTS

    print(f"\n{'bug':34s} {'strategy':10s} {'k':>6s} {'first seed':>10s} {'found in':>14s}")
    for label, scenario, check in depth_cases():
        fixed = bool(findings(scenario, None, "", checks=(check,)))
        for strategy, depth in (("random", 3), ("pct", 1), ("pct", 2), ("pct", 3)):
            hits = [s for s in range(n) if findings(scenario, s, strategy, depth, (check,))]
            k = _PILOTS.get(repr(scenario), "") if strategy == "pct" else ""
            name = strategy if strategy == "random" else f"pct d={depth}"
            print(
                f"{label:34s} {name:10s} {k!s:>6s} {(str(hits[0]) if hits else '-'):>10s} "
                f"{len(hits):>5d}/{n} ({100.0 * len(hits) / n:.0f}%){'' if not fixed else '  (fixed order: found)'}"
            )


def scenario_path(name: str) -> str:
    return os.path.join(ROOT, "examples", "scenarios", name + ".yaml")


def shape_rates(n: int, m: int = 8, others: int = 7):
    """{(shape, strategy label): seeds of n that meet it} for the two shapes of ``--shapes``."""
    from simulators.runtime.explore import Explorer, ExploreSpec

    keys = [(1,), (2,)] + [(3, i) for i in range(others)]  # A, B, the others
    k = len(keys) * m  # every process is ranked at every instant: PCT's k
    hits = {}
    for strategy, depth in (("random", 3), ("pct", 1), ("pct", 2), ("pct", 3)):
        label = strategy if strategy == "random" else f"pct d={depth}"
        every = swap = 0
        for seed in range(n):
            ex = Explorer(ExploreSpec(seed, strategy, depth=depth, steps=k))
            a_first = []
            for t in range(m):
                ranks = {key: ex.rank(key, float(t), float(t)) for key in keys}
                a_first.append(ranks[(1,)] < ranks[(2,)])
            every += all(a_first)
            swap += a_first[0] and not a_first[-1]
        hits[("A before B at all %d instants" % m, label)] = every
        hits[("A before B first, B before A last", label)] = swap
    return hits, k


def shape_table(n: int) -> None:
    hits, k = shape_rates(n)
    print(f"\n{'shape (9 processes, 8 instants, k=%d)' % k:40s} {'strategy':10s} {'found in':>14s}")
    for (shape, label), count in sorted(hits.items(), key=lambda kv: kv[0][0], reverse=True):
        print(f"{shape:40s} {label:10s} {count:>5d}/{n} ({100.0 * count / n:.1f}%)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--sweep-bundled", type=int, default=0, metavar="K")
    ap.add_argument("--depths", action="store_true", help="also compare pct at depths 1..3 with random (more cases)")
    ap.add_argument("--shapes", action="store_true", help="also the two synthetic ordering shapes (explorer only)")
    args = ap.parse_args(argv)
    n = args.seeds
    t0 = time.perf_counter()
    print(f"{'scenario':34s} {'strategy':8s} {'fixed order':12s} {'first seed':>10s} {'found in':>12s}")
    for name, check in BUGS.items():
        fixed = any(v.invariant == check for v in findings(scenario_path(name), None, ""))
        for strategy in ("random", "pct"):
            hits = [
                s for s in range(n) if any(v.invariant == check for v in findings(scenario_path(name), s, strategy))
            ]
            first = str(hits[0]) if hits else "-"
            print(
                f"{name:34s} {strategy:8s} {('found' if fixed else 'clean'):12s} {first:>10s} "
                f"{len(hits):>5d}/{n} ({100.0 * len(hits) / n:.0f}%)"
            )
    for name in FIXES:
        for strategy in ("random", "pct"):
            bad = [s for s in range(n) if findings(scenario_path(name), s, strategy)]
            print(
                f"{name:34s} {strategy:8s} fixed variant: {len(bad)}/{n} seeds with a finding of {', '.join(NEW_CHECKS)}"
            )
    if args.depths:
        depth_table(n)
    if args.shapes:
        shape_table(n)
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
