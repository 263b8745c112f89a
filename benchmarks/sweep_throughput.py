"""What-if sweep throughput (a printed benchmark, not a test).

Runs a 64-variant sweep (8 wake times x 8 bucket sizes) of the 64-GPU scenario, one seed
each, with the figures only (``--no-png``: results.json and table.txt), on 2 local
workers, then the same sweep on a local Ray; prints both wall times and whether the two
results.json files are byte-identical. Target: the local sweep under 60 s on the 2-core
development machine.

    python benchmarks/sweep_throughput.py [--workers 2] [--no-ray]
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIO = os.path.join(ROOT, "examples", "scenarios", "mixed_64gpu.yaml")
GRID = [
    "--set",
    "costs.wake_s=0.4,0.6,0.8,1.0,1.2,1.4,1.6,1.8",
    "--set",
    "costs.bucket_bytes=67108864,134217728,268435456,536870912,1073741824,2147483648,4294967296,8589934592",
]
TARGET_S = 60.0


def _sweep(out: str, where) -> float:
    cmd = [sys.executable, "-m", "rlharness", "sweep", SCENARIO, *GRID, "--no-png", "--quiet", "--out", out, *where]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"sweep failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray run")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="rlharness-sweep-bench-") as tmp:
        local = _sweep(os.path.join(tmp, "local"), ["--workers", str(args.workers)])
        print(
            f"64-variant sweep of mixed_64gpu, figures only, {args.workers} local workers: {local:.1f} s wall "
            f"({64 / local:.2f} runs/s; load {load:.2f} at the start)"
        )
        if not args.no_ray:
            ray = _sweep(os.path.join(tmp, "ray"), ["--ray", "local"])
            same = filecmp.cmp(
                os.path.join(tmp, "local", "results.json"), os.path.join(tmp, "ray", "results.json"), shallow=False
            )
            print(f"same sweep on --ray local: {ray:.1f} s wall; results.json byte-identical: {same}")
    print(f"target: local sweep < {TARGET_S:.0f} s: {local:.1f} s {'met' if local < TARGET_S else 'NOT met'}")


if __name__ == "__main__":
    main()
