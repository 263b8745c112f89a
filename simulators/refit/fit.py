"""The simulator's refit costs fitted to measured syncs (``rlharness calibrate refit``).

The measuring itself (the real stream on this machine) and the two commands live in
``rlharness/refit_calibrate.py``: the simulator never touches a socket or the clock. This
module is the model side of the fit, given measured points ``[(specs, measurement), ...]``
(a measurement has the fields of ``gpu_gates.transports.measure.Measurement``):

* pack / load rates and the per-tensor overhead: least squares (relative error) over the
  sender's measured packing and the receiver's measured loading per configuration;
* staging (allocating and first-touching the two buffers): setup seconds + bytes/rate;
* bucket-cache build: bytes / seconds of ``build_buckets`` on the same tensors;
* per-group round trip and COMPLETE: chosen so the simulated sync time of every grid
  point best matches its measured one (COMPLETE adds a constant; the group overhead is
  searched on a log grid, since it hides behind packing when loads are short).

The fit uses the statistic the commands compare (minimum pack, minimum load, minimum wall:
interference from other processes only ever adds time).

A fit is for use only when :func:`fit_problem` finds nothing: every cost inside
:data:`PHYSICAL_BOUNDS` (rates 1 MB/s-1 TB/s, per-event overheads 1 ns-1 s, or exactly
0: no such cost found), and the grid predicted better than by one bytes-per-second rate
(``rlharness calibrate refit`` refuses to write one that is not). The coordinate search
stays inside the bounds.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Dict, Optional, Tuple

import numpy as np

from harness.ordered_sum import ordered_sum
from simulators.refit.sync import StreamCosts, predict_sync_seconds
from simulators.scenario.spec import CostSpec


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
    costs = {
        "refit_pack_bytes_per_s": 1.0 / inv_pack if inv_pack > 0 else 1e12,
        "receiver_load_bytes_per_s": 1.0 / inv_load if inv_load > 0 else 1e12,
        "refit_tensor_overhead_s": float(tensor_s),
        "refit_setup_s": float(statistics.median(min(m.staging_s) for _, m in points)),
        "refit_staging_bytes_per_s": staging_rate,
        "cache_pack_bytes_per_s": cache_rate,
        "refit_group_overhead_s": 1e-4,
        "refit_complete_s": 1e-3,
    }

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
        return (
            f"the fit predicts the grid no better than one bytes/s rate (squared log error {fitted:.3g} vs {plain:.3g})"
        )
    return None


def stream_costs(costs: Dict[str, float]) -> StreamCosts:
    known = {f.name for f in dataclasses.fields(CostSpec)}
    spec = dataclasses.replace(CostSpec(), **{k: v for k, v in costs.items() if k in known})
    return StreamCosts.from_costs(spec, link_bytes_per_s=spec.refit_pack_bytes_per_s or 1e12)


def predict(specs, budget_bytes: int, costs: Dict[str, float]) -> float:
    return predict_sync_seconds(specs, budget_bytes, stream_costs(costs))
