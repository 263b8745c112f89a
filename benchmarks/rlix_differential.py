"""Differential mode over the bundled scenarios and fuzz seeds, against each pinned RLix
commit: how many scenario traces the model (with the commit's options) and RLix's own
scheduler decide identically, cycle by cycle (a printed figure, not a test).

Each scenario is simulated once (the model decides; the run's input records are the
trace), then the trace goes through :func:`simulators.rlix_live.differential.differential`
with the model's options set as the commit ships (d455b0c: ``demand_floor``). Scenarios
whose own scheduler options are not RLix behaviours (another policy, the oracle's fault
options) are compared with RLix's options all the same: the inputs are what matter.

With ``--in-loop``, each bundled scenario whose scheduler options are the commit's also
runs with RLix's scheduler deciding (``scheduler.implementation: rlix``), and its event log
is compared with the model's run record by record.

    RLHARNESS_UPSTREAM=DIR python benchmarks/rlix_differential.py [--seeds N] [--max-gpus G] [--in-loop]
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from harness.logs.records import Record  # noqa: E402
from harness.scheduler.options import SchedulerOptions  # noqa: E402
from simulators.config_import.table import RLIX, upstream_dir, HOW  # noqa: E402
from simulators.fuzz.generate import scenario_for_seed  # noqa: E402
from simulators.rlix_live.differential import differential  # noqa: E402
from simulators.rlix_live.loader import load_rlix  # noqa: E402
from simulators.runtime.simulation import Simulation  # noqa: E402
from simulators.scenario.loader import load_scenario  # noqa: E402

#: the model's options that make it each commit (docs/rlix-variants.md)
COMMIT_OPTIONS = {"f77d913": {}, "d455b0c": {"demand_floor": True}, "a8460a9": {}}


def traces(max_gpus: int, seeds: int):
    root = os.path.join(os.path.dirname(__file__), "..", "examples", "scenarios")
    for path in sorted(glob.glob(os.path.join(root, "*.yaml"))):
        s = load_scenario(path)
        if s.cluster.num_gpus <= max_gpus:
            yield os.path.basename(path), s
    for seed in range(seeds):
        s = scenario_for_seed(seed)
        if s.cluster.num_gpus <= max_gpus:
            yield f"fuzz seed {seed}", s


def in_loop(source: str, commit: str, max_gpus: int) -> None:
    """Bundled scenarios whose scheduler options are exactly the commit's, run with RLix deciding."""
    import json

    from simulators.scenario.loader import read_mapping, scenario_from_mapping

    root = os.path.join(os.path.dirname(__file__), "..", "examples", "scenarios")
    same = ran = 0
    for path in sorted(glob.glob(os.path.join(root, "*.yaml"))):
        data = read_mapping(path)
        if (data.get("scheduler") or {}) != COMMIT_OPTIONS[commit]:
            continue
        model_run = Simulation(scenario_from_mapping(data, path)).run()
        if model_run.scenario.cluster.num_gpus > max_gpus:
            continue
        live = dict(data, scheduler=dict(COMMIT_OPTIONS[commit], implementation="rlix", source=source))
        rlix_run = Simulation(scenario_from_mapping(live, path)).run()
        ran += 1
        if [json.dumps(r) for r in rlix_run.records[1:]] == [json.dumps(r) for r in model_run.records[1:]]:
            same += 1
        else:
            print(f"  {commit} in the loop: {os.path.basename(path)}: event log differs from the model's run")
    print(f"rlix {commit} in the loop: {same}/{ran} bundled scenarios give the model's event log record for record")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--max-gpus", type=int, default=64)
    ap.add_argument("--in-loop", action="store_true", help="also run the bundled scenarios with RLix deciding")
    args = ap.parse_args()
    upstream = upstream_dir()
    if upstream is None:
        print(f"skipped: {HOW}")
        return 0
    runs = []
    start = time.process_time()
    for name, s in traces(args.max_gpus, args.seeds):
        records = Simulation(s).run().records
        runs.append((name, [Record(i + 1, r) for i, r in enumerate(records)]))
    print(f"{len(runs)} traces simulated in {time.process_time() - start:.1f} CPU s")
    with tempfile.TemporaryDirectory() as tmp:
        for archive in RLIX:
            commit = archive.split("-")[1].split(".")[0]
            with tarfile.open(os.path.join(upstream, archive)) as tar:
                tar.extractall(tmp, filter="data")
            mods = load_rlix(os.path.join(tmp, f"rlix-{commit}"), commit)
            options = SchedulerOptions(**COMMIT_OPTIONS[commit])
            agree, cycles, t0 = 0, 0, time.process_time()
            for name, recs in runs:
                res = differential(recs, mods, options, name)
                cycles += res.cycles
                if res.divergence is None:
                    agree += 1
                else:
                    dv = res.divergence
                    print(
                        f"  {commit} {name}: diverged at cycle {dv.cycle} (line {dv.at_line}): model {dv.model} "
                        f"rlix {dv.rlix}"
                    )
            print(
                f"rlix {commit} (options {COMMIT_OPTIONS[commit] or 'default'}): {agree}/{len(runs)} traces agree, "
                f"{cycles} cycles compared, {time.process_time() - t0:.1f} CPU s"
            )
            if args.in_loop:
                in_loop(os.path.join(tmp, f"rlix-{commit}"), commit, args.max_gpus)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
