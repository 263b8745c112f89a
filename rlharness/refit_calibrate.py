"""``rlharness calibrate refit`` and ``rlharness fidelity refit``: the simulator's refit
model, fitted to and checked against the real transport on this machine.

calibrate: run the real stream (gpu_gates/transports/measure.py: pyzmq ipc://, /dev/shm
ping-pong buffers, a receiver process) over a grid of model sizes x buffer budgets, fit
the costs :func:`simulators.refit.sync.stream_sync` charges for each effect of the one
protocol (:func:`simulators.refit.fit.fit`), and write a calibration file
(simulators/refit/calibration.py) a scenario can name.

It lives in ``rlharness/`` (above both runtimes) because it needs the real transport from
``gpu_gates/`` and the simulator's model from ``simulators/``, and neither of those may
import the other.

A fit is written only when :func:`simulators.refit.fit.fit_problem` finds nothing wrong
with it (every cost physical, the grid predicted better than by one bytes/s rate);
otherwise the table is printed, then one ``error: calibrate refit: ...`` line, exit 1,
nothing written. (A one-repeat ``--quick`` run on a loaded machine once wrote a receiver
load rate of 7.8e16 B/s and a per-tensor overhead of 1.4e-15 s.)

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

import platform
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from harness.exit_codes import ExitCode
from simulators.refit.calibration import CalibrationError, load_calibration, write_calibration
from simulators.refit.fit import fit, fit_problem, predict

MiB = 1 << 20
GRID = [(m * MiB, b * MiB) for m in (4, 16, 48) for b in (1, 4, 16)]
QUICK_GRID = [(m * MiB, b * MiB) for m in (4, 24) for b in (1, 8)]
HELD_OUT = [
    (6 * MiB, 3 * MiB),
    (12 * MiB, 6 * MiB),
    (24 * MiB, 2 * MiB),
    (32 * MiB, 12 * MiB),
    (40 * MiB, 24 * MiB),
    (64 * MiB, 8 * MiB),
]
TARGET_MEDIAN, TARGET_WORST = 0.10, 0.20


WARMUP = 1  # unrecorded syncs before each recorded one (see the module docstring)


def _measure(grid: Sequence[Tuple[int, int]], repeats: int, progress) -> list:
    """Measure every configuration ``repeats`` times, round-robin over the grid, so a burst
    of load from other processes lands on many configurations once rather than one
    configuration ``repeats`` times; each recorded sync follows a warm-up sync."""
    from gpu_gates.transports.measure import Measurement, StreamBench, materialize, synthetic_specs

    points = []
    with StreamBench() as bench:
        for i, (model, budget) in enumerate(grid):
            specs = synthetic_specs(model)
            points.append(
                (
                    specs,
                    Measurement(sum(s.nbytes for s in specs), budget, 0, len(specs)),
                    materialize(specs, i),
                    max(budget // 2, max(s.nbytes for s in specs)),
                )
            )
        for _ in range(repeats):
            for specs, m, named, cache_bucket in points:
                bench.measure(
                    specs,
                    m.budget_bytes,
                    repeats=1,
                    cache_bucket_bytes=cache_bucket,
                    into=m,
                    named=named,
                    warmup=WARMUP,
                )
    for _specs, m, _named, _ in points:
        progress(
            f"  {m.model_bytes / MiB:5.0f} MiB model, {m.budget_bytes / MiB:4.1f} MiB budget: {m.groups:3d} groups, "
            f"median {m.median_s * 1e3:7.1f} ms, best {m.best_s * 1e3:7.1f} ms"
        )
    return [(specs, m) for specs, m, _named, _ in points]


def _machine() -> Dict[str, object]:
    import os

    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def _table(points: list, costs: Dict[str, float]) -> Tuple[List[str], List[float]]:
    lines = [
        f"{'model MiB':>9} {'budget MiB':>10} {'groups':>6} {'measured ms':>11} {'median ms':>9} "
        f"{'simulated ms':>12} {'error':>7}"
    ]
    errors = []
    for specs, m in points:
        p = predict(specs, m.budget_bytes, costs)
        err = (p - m.best_s) / m.best_s
        errors.append(err)
        lines.append(
            f"{m.model_bytes / MiB:9.0f} {m.budget_bytes / MiB:10.1f} {m.groups:6d} {m.best_s * 1e3:11.1f} "
            f"{m.median_s * 1e3:9.1f} {p * 1e3:12.1f} {err * 100:+6.1f}%"
        )
    return lines, errors


def cmd_calibrate(out: str, repeats: int, quick: bool) -> int:
    grid = QUICK_GRID if quick else GRID
    print(
        f"calibrating the refit stream on this machine: {len(grid)} configurations x {repeats} repeats "
        f"(real transport: pyzmq ipc://, /dev/shm ping-pong buffers, a receiver process)"
    )
    t0 = time.monotonic()
    points = _measure(grid, repeats, print)
    costs = fit(points)
    lines, errors = _table(points, costs)
    print("fitted costs:")
    for k, v in costs.items():
        print(f"  {k:28s} {v:.6g}")
    print("fit on the calibration grid (simulated vs measured):")
    print("\n".join("  " + line for line in lines))
    problem = fit_problem(points, costs)  # a fit no simulation should use is not written
    if problem is not None:
        print(
            f"error: calibrate refit: {problem}; {out} not written (measure again: without --quick, with more "
            f"--repeats, on a quieter machine)",
            file=sys.stderr,
        )
        return ExitCode.FINDING
    write_calibration(
        out,
        costs,
        machine=_machine(),
        repeats=repeats,
        grid=[m.to_json() for _, m in points],
        fit={"errors_on_grid": [round(e, 4) for e in errors]},
    )
    print(f"wrote {out} ({time.monotonic() - t0:.0f} s); a scenario uses it with `refit_calibration: {out}`")
    return ExitCode.OK


def cmd_fidelity(calibration: Optional[str], repeats: int, strict: bool, alongside: bool = False) -> int:
    if alongside:
        print(
            f"refit fidelity: {len(HELD_OUT)} configurations not on the calibration grid, measured in the same "
            f"interleaved rounds as the {len(GRID)}-point grid the costs are fitted on; {repeats} repeats each, "
            f"load {_machine()['load_1min']}"
        )
        measured = _measure(GRID + HELD_OUT, repeats, lambda line: None)
        costs = fit(measured[: len(GRID)])
        points = measured[len(GRID) :]
    else:
        try:
            costs = load_calibration(calibration)
        except CalibrationError as e:
            print(f"error: {e}", file=sys.stderr)
            return ExitCode.BAD_INPUT
        print(
            f"refit fidelity: {len(HELD_OUT)} configurations not on the calibration grid, {repeats} repeats each, "
            f"costs from {calibration}, load {_machine()['load_1min']}"
        )
        points = _measure(HELD_OUT, repeats, lambda line: None)
    lines, errors = _table(points, costs)
    print("\n".join(lines))
    med = statistics.median(abs(e) for e in errors)
    worst = max(abs(e) for e in errors)
    ok = med <= TARGET_MEDIAN and worst <= TARGET_WORST
    print(
        f"median |error| {med * 100:.1f} % (target <= {TARGET_MEDIAN * 100:.0f} %), "
        f"worst |error| {worst * 100:.1f} % (target <= {TARGET_WORST * 100:.0f} %): {'met' if ok else 'MISSED'}"
    )
    return ExitCode.FINDING if strict and not ok else ExitCode.OK
