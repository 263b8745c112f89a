"""``rlharness calibrate refit`` and ``rlharness fidelity refit``: the simulator's refit
model, fitted to and checked against the real transport on this machine.

calibrate: run the real stream (harness/refit/measure.py: pyzmq ipc://, /dev/shm
ping-pong buffers, a receiver process) over a grid of model sizes x buffer budgets, fit
the costs :func:`simulators.refit.stream_sync` charges for each effect of the one
protocol, and write a calibration file (simulators/calibration.py) a scenario can name.

* pack / load rates and the per-tensor overhead: least squares (relative error) over the
  sender's measured packing and the receiver's measured loading per configuration;
* staging (allocating and first-touching the two buffers): setup seconds + bytes/rate;
* bucket-cache build: bytes / seconds of ``build_buckets`` on the same tensors;
* per-group round trip and COMPLETE: chosen so the simulated sync time of every grid
  point best matches its measured one (COMPLETE adds a constant; the group overhead is
  searched on a log grid, since it hides behind packing when loads are short).

A fit is written only when it is one a simulation should use (:func:`fit_problem`):
every cost inside :data:`PHYSICAL_BOUNDS` (rates 1 MB/s-1 TB/s, per-event overheads
1 ns-1 s, or exactly 0: no such cost found), and the grid predicted better than by one
bytes-per-second rate. Otherwise the table is printed, then one ``error: calibrate
refit: ...`` line naming the cost or the comparison, exit 1, nothing written. (A
one-repeat ``--quick`` run on a loaded machine once wrote a receiver load rate of
7.8e16 B/s and a per-tensor overhead of 1.4e-15 s.)

fidelity: measure held-out configurations (none of them on the calibration grid) afresh
and print each one's measured and simulated sync time and the error; target median
absolute error <= 10 %, worst <= 20 %. ``--fit-alongside`` measures the calibration grid
in the same interleaved rounds and fits on it first, so the fit and the check see the
same machine (on a shared machine the speed drifts 2-4x within minutes, which a file
fitted earlier cannot know); the held-out points are still never used for fitting.

What counts as a configuration's time, in both commands alike: the minimum of N sender
walls (N = --repeats), each taken after one unrecorded warm-up sync of the same
configuration (it re-sizes the pooled staging buffers and the receiver's mappings left
by the previous configuration: the steady state of repeated syncs, which the simulator
models), the configurations interleaved round by round. Interference from other
processes only ever adds time, so the minimum is the figure that repeats; the fit uses
the same statistic (minimum pack, minimum load, minimum wall). The median is printed too.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from harness.ordered_sum import ordered_sum
from simulators.calibration import CalibrationError, load_calibration, write_calibration
from simulators.refit import StreamCosts, predict_sync_seconds
from simulators.spec import CostSpec

MiB = 1 << 20
GRID = [(m * MiB, b * MiB) for m in (4, 16, 48) for b in (1, 4, 16)]
QUICK_GRID = [(m * MiB, b * MiB) for m in (4, 24) for b in (1, 8)]
HELD_OUT = [(6 * MiB, 3 * MiB), (12 * MiB, 6 * MiB), (24 * MiB, 2 * MiB), (32 * MiB, 12 * MiB),
            (40 * MiB, 24 * MiB), (64 * MiB, 8 * MiB)]
TARGET_MEDIAN, TARGET_WORST = 0.10, 0.20


WARMUP = 1  # unrecorded syncs before each recorded one (see the module docstring)


def _measure(grid: Sequence[Tuple[int, int]], repeats: int, progress) -> list:
    """Measure every configuration ``repeats`` times, round-robin over the grid, so a burst
    of load from other processes lands on many configurations once rather than one
    configuration ``repeats`` times; each recorded sync follows a warm-up sync."""
    from harness.refit.measure import Measurement, StreamBench, materialize, synthetic_specs

    points = []
    with StreamBench() as bench:
        for i, (model, budget) in enumerate(grid):
            specs = synthetic_specs(model)
            points.append((specs, Measurement(sum(s.nbytes for s in specs), budget, 0, len(specs)),
                           materialize(specs, i), max(budget // 2, max(s.nbytes for s in specs))))
        for _ in range(repeats):
            for specs, m, named, cache_bucket in points:
                bench.measure(specs, m.budget_bytes, repeats=1, cache_bucket_bytes=cache_bucket, into=m, named=named,
                              warmup=WARMUP)
    for _specs, m, _named, _ in points:
        progress(f"  {m.model_bytes / MiB:5.0f} MiB model, {m.budget_bytes / MiB:4.1f} MiB budget: {m.groups:3d} groups, "
                 f"median {m.median_s * 1e3:7.1f} ms, best {m.best_s * 1e3:7.1f} ms")
    return [(specs, m) for specs, m, _named, _ in points]


def _lstsq_nonneg(rows: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares with each unknown clamped at >= 0 (refit without a negative one)."""
    keep = list(range(rows.shape[1]))
    while True:
        x = np.zeros(rows.shape[1])
        x[keep] = np.linalg.lstsq(rows[:, keep], target, rcond=None)[0]
        neg = [k for k in keep if x[k] < 0]
        if not neg:
            return x
        keep.remove(neg[0])


def fit(points: list) -> Dict[str, float]:
    """Fit every calibrated cost from measured grid points ``[(specs, Measurement), ...]``.

    Start from each cost's own measurement, then refine all of them together so the
    simulated sync times match the measured ones (coordinate search on the summed squared
    log-ratio): the per-effect timings do not add up to the wall time on their own, since
    wake-ups and scheduling between the two processes show up as waits, not as copies."""
    rows, target = [], []
    for _specs, m in points:
        for side, seconds in ((0, min(m.pack_s)), (1, min(m.load_s))):
            row = [0.0, 0.0, m.tensors]
            row[side] = m.model_bytes
            rows.append([v / seconds for v in row])
            target.append(1.0)
    inv_pack, inv_load, tensor_s = _lstsq_nonneg(np.array(rows), np.array(target))
    dedicated = [(m.dedicated_bytes, min(m.dedicated_s)) for _, m in points if m.dedicated_bytes]
    staging_rate = sum(b for b, _ in dedicated) / max(ordered_sum(t for _, t in dedicated), 1e-9) if dedicated else 0.0
    cache_rate = sum(m.model_bytes for _, m in points) / ordered_sum(min(m.cache_build_s) for _, m in points)
    costs = {"refit_pack_bytes_per_s": 1.0 / inv_pack if inv_pack > 0 else 1e12,
             "receiver_load_bytes_per_s": 1.0 / inv_load if inv_load > 0 else 1e12,
             "refit_tensor_overhead_s": float(tensor_s),
             "refit_setup_s": float(statistics.median(min(m.staging_s) for _, m in points)),
             "refit_staging_bytes_per_s": staging_rate, "cache_pack_bytes_per_s": cache_rate,
             "refit_group_overhead_s": 1e-4, "refit_complete_s": 1e-3}

    def loss(c: Dict[str, float]) -> float:
        return ordered_sum(math.log(predict(specs, m.budget_bytes, c) / m.best_s) ** 2 for specs, m in points)

    best = loss(costs)
    tuned = [k for k in costs if k != "cache_pack_bytes_per_s" and (k != "refit_staging_bytes_per_s" or staging_rate)]
    for _round in range(8):
        improved = False
        for key in tuned:
            for factor in (0.25, 0.5, 0.8, 1.25, 2.0, 4.0):
                trial = {**costs, key: costs[key] * factor}
                lo, hi = PHYSICAL_BOUNDS.get(key, (0.0, math.inf))
                if not lo <= trial[key] <= hi:  # the search stays physical (setup and complete
                    continue  # are both per sync: unbounded, one of them drifted to 3e-10 s)
                value = loss(trial)
                if value < best - 1e-12:
                    costs, best, improved = trial, value, True
        if not improved:
            break
    return costs


#: What a fitted cost may be on any real machine (inclusive), or exactly 0: the fit found
#: no such cost (a least-squares term clamped at zero; the simulator then charges none). Rates: a copy through
#: host memory or a socket is neither slower than 1 MB/s (a stalled run) nor faster than
#: 1 TB/s (no host moves memory faster; `calibrate --quick` once wrote 7.8e16 B/s).
#: Per-event overheads: a Python-level call (a tensor copy, a message, an ACK) takes at
#: more than a nanosecond and none takes a second (`--quick` once wrote 1.4e-15 s a tensor).
PHYSICAL_BOUNDS: Dict[str, Tuple[float, float]] = {
    "refit_pack_bytes_per_s": (1e6, 1e12),
    "receiver_load_bytes_per_s": (1e6, 1e12),
    "cache_pack_bytes_per_s": (1e6, 1e12),
    "refit_staging_bytes_per_s": (1e6, 1e12),
    "refit_tensor_overhead_s": (1e-9, 1.0),
    "refit_group_overhead_s": (1e-9, 1.0),
    "refit_setup_s": (1e-9, 1.0),
    "refit_complete_s": (1e-9, 1.0),
}


def rate_only_loss(points: list) -> float:
    """The loss (summed squared log-ratio of simulated to measured sync time) of the
    plainest model: sync seconds = bytes / one rate, the rate fitted in closed form (the
    geometric mean of bytes / seconds minimizes the summed squared log-ratio)."""
    logs = [math.log(m.model_bytes / m.best_s) for _specs, m in points]
    log_rate = ordered_sum(logs) / len(logs)
    return ordered_sum((log_rate - x) ** 2 for x in logs)


def fit_problem(points: list, costs: Dict[str, float]) -> Optional[str]:
    """Why the fitted ``costs`` must not be written, or ``None``: a cost outside
    :data:`PHYSICAL_BOUNDS`, or a fit that predicts the grid no better than one
    bytes-per-second rate does (its extra parameters then only fit noise)."""
    for key, (lo, hi) in PHYSICAL_BOUNDS.items():
        value = costs.get(key)
        if value is None or value == 0.0:  # 0: the fit found no such cost (the simulator charges none)
            continue
        if not lo <= value <= hi:
            return f"{key} = {value:.3g} is outside physical bounds [{lo:g}, {hi:g}]"
    fitted = ordered_sum(math.log(predict(specs, m.budget_bytes, costs) / m.best_s) ** 2 for specs, m in points)
    plain = rate_only_loss(points)
    if fitted >= plain:
        return (f"the fit predicts the grid no better than one bytes/s rate (squared log error {fitted:.3g} "
                f"vs {plain:.3g})")
    return None


def stream_costs(costs: Dict[str, float]) -> StreamCosts:
    known = {f.name for f in dataclasses.fields(CostSpec)}
    spec = dataclasses.replace(CostSpec(), **{k: v for k, v in costs.items() if k in known})
    return StreamCosts.from_costs(spec, link_bytes_per_s=spec.refit_pack_bytes_per_s or 1e12)


def predict(specs, budget_bytes: int, costs: Dict[str, float]) -> float:
    return predict_sync_seconds(specs, budget_bytes, stream_costs(costs))


def _machine() -> Dict[str, object]:
    import os

    return {"host": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def _table(points: list, costs: Dict[str, float]) -> Tuple[List[str], List[float]]:
    lines = [f"{'model MiB':>9} {'budget MiB':>10} {'groups':>6} {'measured ms':>11} {'median ms':>9} "
             f"{'simulated ms':>12} {'error':>7}"]
    errors = []
    for specs, m in points:
        p = predict(specs, m.budget_bytes, costs)
        err = (p - m.best_s) / m.best_s
        errors.append(err)
        lines.append(f"{m.model_bytes / MiB:9.0f} {m.budget_bytes / MiB:10.1f} {m.groups:6d} {m.best_s * 1e3:11.1f} "
                     f"{m.median_s * 1e3:9.1f} {p * 1e3:12.1f} {err * 100:+6.1f}%")
    return lines, errors


def cmd_calibrate(out: str, repeats: int, quick: bool) -> int:
    grid = QUICK_GRID if quick else GRID
    print(f"calibrating the refit stream on this machine: {len(grid)} configurations x {repeats} repeats "
          f"(real transport: pyzmq ipc://, /dev/shm ping-pong buffers, a receiver process)")
    t0 = time.monotonic()
    points = _measure(grid, repeats, print)
    costs = fit(points)
    lines, errors = _table(points, costs)
    print("fitted costs:")
    for k, v in costs.items():
        print(f"  {k:28s} {v:.6g}")
    print("fit on the calibration grid (simulated vs measured):")
    print("\n".join("  " + line for line in lines))
    problem = fit_problem(points, costs)
    if problem is not None:
        print(f"error: calibrate refit: {problem}; {out} not written (measure again: without --quick, with more "
              f"--repeats, on a quieter machine)", file=sys.stderr)
        return 1
    write_calibration(out, costs, machine=_machine(), repeats=repeats,
                      grid=[m.to_json() for _, m in points],
                      fit={"errors_on_grid": [round(e, 4) for e in errors]})
    print(f"wrote {out} ({time.monotonic() - t0:.0f} s); a scenario uses it with `refit_calibration: {out}`")
    return 0


def cmd_fidelity(calibration: Optional[str], repeats: int, strict: bool, alongside: bool = False) -> int:
    if alongside:
        print(f"refit fidelity: {len(HELD_OUT)} configurations not on the calibration grid, measured in the same "
              f"interleaved rounds as the {len(GRID)}-point grid the costs are fitted on; {repeats} repeats each, "
              f"load {_machine()['load_1min']}")
        measured = _measure(GRID + HELD_OUT, repeats, lambda line: None)
        costs = fit(measured[:len(GRID)])
        points = measured[len(GRID):]
    else:
        try:
            costs = load_calibration(calibration)
        except CalibrationError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"refit fidelity: {len(HELD_OUT)} configurations not on the calibration grid, {repeats} repeats each, "
              f"costs from {calibration}, load {_machine()['load_1min']}")
        points = _measure(HELD_OUT, repeats, lambda line: None)
    lines, errors = _table(points, costs)
    print("\n".join(lines))
    med = statistics.median(abs(e) for e in errors)
    worst = max(abs(e) for e in errors)
    ok = med <= TARGET_MEDIAN and worst <= TARGET_WORST
    print(f"median |error| {med * 100:.1f} % (target <= {TARGET_MEDIAN * 100:.0f} %), "
          f"worst |error| {worst * 100:.1f} % (target <= {TARGET_WORST * 100:.0f} %): {'met' if ok else 'MISSED'}")
    return 1 if strict and not ok else 0
