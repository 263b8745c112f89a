"""Sweep throughput of ``rlharness fuzz`` (a printed benchmark, not a test).

In one run, on the same seeds: seeds per minute on K local worker processes, the same
with ``--check-determinism`` (each seed again in a fresh interpreter), and on a local Ray
instance with K CPUs (its start-up timed apart); then the per-seed overhead Ray adds
(its wall time minus the local wall time, divided by the seeds) and whether the two
result files are byte-identical. Minimization is left out: it is per finding, not per
seed.

Target (issue "Swarm testing at scale"): 200 seeds with --check-determinism in under
5 minutes on this 2-core machine, i.e. at least 40 seeds/min with the check.

    python benchmarks/fuzz_throughput.py [--seeds N] [--workers K] [--skip-ray]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from simulators.fuzz.sweep import SweepConfig, results_json, run_sweep  # noqa: E402


def _sweep(seeds: int, workers: int, **kw):
    t0 = time.perf_counter()
    sweep = run_sweep(SweepConfig(seeds=seeds, workers=workers, **kw), minimize_findings=False)
    return sweep, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-ray", action="store_true")
    args = ap.parse_args()
    n, k = args.seeds, args.workers
    rows = []
    local, local_s = _sweep(n, k)
    rows.append((f"local, {k} workers", local_s))
    checked, checked_s = _sweep(n, k, check_determinism=True)
    rows.append((f"local, {k} workers, --check-determinism", checked_s))
    ray_line = None
    if not args.skip_ray:
        try:
            import ray
        except ImportError:
            ray_line = "ray: not installed (pip install ray)"
        else:
            t0 = time.perf_counter()
            ray.init(num_cpus=k, include_dashboard=False, log_to_driver=False, configure_logging=False)
            init_s = time.perf_counter() - t0
            try:
                on_ray, ray_s = _sweep(n, k, ray_address="local")
            finally:
                ray.shutdown()
            rows.append((f"Ray (local, {k} CPUs)", ray_s))
            same = results_json(on_ray.results) == results_json(local.results)
            ray_line = (
                f"Ray: start-up {init_s:.1f} s (not in its row); overhead {(ray_s - local_s) / n * 1000:+.0f} ms per seed "
                f"over local; results byte-identical to local: {'yes' if same else 'NO'}"
            )
    print(f"{n} seeds (0..{n - 1}), {os.cpu_count()} CPU(s) on this machine")
    print(f"{'executor':<44} {'wall s':>8} {'seeds/min':>10}")
    for label, wall in rows:
        print(f"{label:<44} {wall:>8.1f} {n / wall * 60:>10.0f}")
    if ray_line:
        print(ray_line)
    rate = n / checked_s * 60
    print(
        f"target: 200 seeds with --check-determinism under 300 s -> {200 / rate * 60:.0f} s projected "
        f"({rate:.0f} seeds/min): {'met' if 200 / rate * 60 < 300 else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
