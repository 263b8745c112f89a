"""The PNG timeline's cost against the simulation's (a printed benchmark, not a test).

For the 64-GPU and the 1024-GPU bundled scenarios: the simulation's wall time
(``Simulation(...).run()``), then the timeline PNG's wall time (and CPU time of each) on the run's
:class:`RunView` after the summary has derived the intervals (as ``rlharness simulate``
draws it: the summary, trace and picture share one derivation), best of ``--repeats``.
Targets (the outputs issue): the 64-GPU PNG within 3x the simulation's time, the
1024-GPU PNG under 1 s. The 1-minute load average is printed first and last: on a
shared machine, compare figures of one sitting only.

    python benchmarks/timeline_png.py [--repeats 3] [--skip-large] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SCENARIOS = (("64-GPU", "mixed_64gpu.yaml"), ("1024-GPU", "large_1024gpu.yaml"))


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def measure(path: str, repeats: int, keep: str = "") -> tuple:
    from harness.logs.outputs.run_view import RunView
    from harness.logs.outputs.summary import summarize
    from harness.logs.outputs.timeline import render_timeline_png
    from simulators.runtime.simulation import Simulation
    from simulators.scenario.loader import load_scenario

    scenario = load_scenario(path)
    sim_s, sim_cpu, result = float("inf"), float("inf"), None
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        result = Simulation(scenario).run()
        sim_s, sim_cpu = min(sim_s, time.perf_counter() - t), min(sim_cpu, time.process_time() - c)
    view = RunView(result.records)
    summarize(view)  # derives the intervals the picture shares, as simulate does
    png_s, png_cpu, data = float("inf"), float("inf"), b""
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        data = render_timeline_png(view)
        png_s, png_cpu = min(png_s, time.perf_counter() - t), min(png_cpu, time.process_time() - c)
    if keep:
        os.makedirs(keep, exist_ok=True)
        with open(os.path.join(keep, os.path.basename(path).replace(".yaml", ".png")), "wb") as fh:
            fh.write(data)
    return sim_s, png_s, sim_cpu, png_cpu, len(result.records), len(data)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--keep", default="", metavar="DIR", help="write the PNGs here to look at")
    args = ap.parse_args()
    print(f"load (1 min) at start: {_load()}, {os.cpu_count()} CPUs")
    figures = {}
    for label, name in SCENARIOS[:1] if args.skip_large else SCENARIOS:
        sim_s, png_s, sim_cpu, png_cpu, records, size = measure(
            os.path.join(ROOT, "examples", "scenarios", name), args.repeats, args.keep
        )
        figures[label] = (sim_s, png_s)
        print(
            f"{label:9s} simulation {sim_s:7.3f} s ({sim_cpu:.3f} CPU s)   PNG {png_s:7.3f} s ({png_cpu:.3f} CPU s)   "
            f"({png_s / sim_s:5.2f}x the simulation; {records:,} records, {size:,} bytes)"
        )
    sim_s, png_s = figures["64-GPU"]
    print(f"target 64-GPU PNG <= 3x simulation: {'met' if png_s <= 3 * sim_s else 'MISSED'} ({png_s / sim_s:.2f}x)")
    if "1024-GPU" in figures:
        png_s = figures["1024-GPU"][1]
        print(f"target 1024-GPU PNG < 1 s: {'met' if png_s < 1.0 else 'MISSED'} ({png_s:.3f} s)")
    print(f"load (1 min) at end: {_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
