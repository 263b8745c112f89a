"""CPU, wall time and peak RSS of ``rlharness simulate`` end to end at 1,024 to 8,192 GPUs.

Each size's scenario comes from :mod:`benchmarks.scale_scenarios` (N pipelines after
``examples/scenarios/large_1024gpu.yaml``, staggered starts; 1,024 GPUs is the bundled
scenario itself). Per size, in fresh processes one after the other (never two at once):

- ``simulation``: ``Simulation(scenario).run()`` alone, its log kept in memory (what a
  run cost before its outputs, and the in-memory path's floor);
- ``end to end``: ``rlharness simulate SCENARIO --out DIR --quiet --no-png`` (add
  ``--png`` to draw the picture too): the event log streamed to disk, the oracle and the
  summary and trace made as the run goes (simulators/run_streamed.py).

Printed: records, CPU s (user + system), wall s, peak RSS (the process's maximum
resident set), the CPU per record, and end to end against the simulation (the target:
at most 1.5x at 1,024 GPUs; peak RSS under 1 GiB at 4,096 GPUs). The figures depend on
the machine's load: print ``uptime`` beside them.

    nice python benchmarks/scale_runs.py [--gpus 1024 2048 4096 8192] [--steps 100] [--png] [--skip-simulation]
"""

from __future__ import annotations

import argparse
import json
import os

import subprocess
import sys
import tempfile
import time
from typing import Dict, List

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scale_scenarios import scale_scenario  # noqa: E402

_SIM_ONLY = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario
result = Simulation(load_scenario({path!r})).run()
print(json.dumps({{"records": len(result.records), "reason": result.reason}}))
"""


def _child(cmd: List[str]) -> Dict[str, float]:
    """Run ``cmd``; its CPU s, wall s and peak RSS (MiB), from the kernel's accounting of
    the one child waited for (``wait4``), and its stdout."""
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.stdout.read(), proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):  # 1: the run's findings (the bundled scenario's planned_release_ack)
        raise SystemExit(f"{' '.join(cmd[:4])}...: exit {code}: {err.strip().splitlines()[-1:] or ''}")
    return {"cpu": usage.ru_utime + usage.ru_stime, "wall": wall, "rss": usage.ru_maxrss / 1024.0, "out": out}


def measure(gpus: int, steps: int, png: bool, simulation: bool) -> Dict[str, object]:
    import yaml

    row: Dict[str, object] = {"gpus": gpus}
    with tempfile.TemporaryDirectory(prefix="scale-runs-") as tmp:
        path = os.path.join(tmp, f"scale_{gpus}.yaml")
        with open(path, "w", encoding="utf-8") as fh:
            yaml.safe_dump(scale_scenario(gpus, steps), fh, sort_keys=False)
        if simulation:
            sim = _child([sys.executable, "-c", _SIM_ONLY.format(root=ROOT, path=path)])
            row["sim"] = sim
            row["records"] = json.loads(sim["out"].strip().splitlines()[-1])["records"]
        cmd = [sys.executable, "-m", "rlharness", "simulate", path, "--out", os.path.join(tmp, "run"), "--quiet"]
        e2e = _child(cmd + ([] if png else ["--no-png"]))
        row["e2e"] = e2e
        line = next((ln for ln in e2e["out"].splitlines() if " records;" in ln), "")
        words = line.split(" records;")[0].split()
        if words and words[-1].isdigit():
            row["records"] = int(words[-1])
        row["events_bytes"] = os.path.getsize(os.path.join(tmp, "run", "events.jsonl"))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--png", action="store_true", help="draw timeline.png too (off by default: see the docs)")
    ap.add_argument("--skip-simulation", action="store_true", help="only the end-to-end runs")
    args = ap.parse_args(argv)
    print(
        f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (1/5/15 min), "
        f"{os.cpu_count()} CPUs; {args.steps} steps per pipeline; picture {'on' if args.png else 'off'}",
        flush=True,
    )
    print(
        f"{'GPUs':>6} {'records':>9}  {'sim CPU s':>9} {'sim RSS MiB':>11}  {'e2e CPU s':>9} {'e2e wall s':>10} "
        f"{'e2e RSS MiB':>11} {'e2e us/rec':>10} {'e2e/sim CPU':>11}",
        flush=True,
    )
    for gpus in args.gpus:
        row = measure(gpus, args.steps, args.png, not args.skip_simulation)
        n = int(row.get("records") or 0)
        sim, e2e = row.get("sim"), row["e2e"]
        print(
            f"{gpus:>6} {n:>9}  {sim['cpu'] if sim else float('nan'):>9.1f} {sim['rss'] if sim else float('nan'):>11.0f}  "
            f"{e2e['cpu']:>9.1f} {e2e['wall']:>10.1f} {e2e['rss']:>11.0f} {1e6 * e2e['cpu'] / max(n, 1):>10.1f} "
            f"{(e2e['cpu'] / sim['cpu']) if sim else float('nan'):>11.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
