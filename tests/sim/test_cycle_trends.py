"""N-cycle trends (``cycle_trends``, harness/logs/invariants/trends.py): a leak per cycle shows
as a fitted slope over >= 20 sleep/wake/refit cycles, in crafted logs and in simulated
runs with each leak class's fault; the clean runs stay flat."""

from __future__ import annotations

import numpy as np
import pytest

from harness.logs.invariants import check_log, trends
from rlharness.pytest_plugin import run

STEPS = {"pipelines[0].steps": 24, "pipelines[1].steps": 24}
STRANDED = "examples/scenarios/stranded_sync_group.yaml"


def _samples(series: str, values) -> list:
    return [
        {"seq": i, "t": float(i), "kind": "trend_sample", "rank": 0, "series": series, "cycle": i, "value": v}
        for i, v in enumerate(values)
    ]


def test_the_slope_is_numpys_least_squares_fit():
    rng = np.random.default_rng(3)
    x = np.arange(20)
    y = 7.0 * x + 100 + rng.normal(0, 2, size=20)
    assert trends.fit_slope(x, y) == pytest.approx(np.polyfit(x, y, 1)[0], rel=1e-9)


def test_a_steady_leak_fires_and_names_the_series():
    log = _samples("residue_bytes/engine", [(4 << 30) + i * (64 << 20) for i in range(20)])
    (v,) = check_log(log, ["cycle_trends"])
    assert "residue_bytes/engine@rank0" in v.message and "over 20 cycles" in v.message


def test_one_outlier_does_not_fire_where_a_difference_would():
    values = [0.010] * 19 + [0.060]  # the last refit was slow once: last - first is 50 ms
    assert check_log(_samples("refit_s/trainer", values), ["cycle_trends"]) == []
    values = [1.0] * 19 + [2.0]  # one group too many at the end only: slope 0.0226 < 0.1
    assert check_log(_samples("live_groups/rank", values), ["cycle_trends"]) == []
    values = [0.0] * 3 + [1.0] * 3  # one group stranded once, mid-run: slope 0.26 but fitted growth 1.3
    assert check_log(_samples("live_groups/rank", values), ["cycle_trends"]) == []
    assert check_log(_samples("live_groups/rank", [0, 0, 1, 1, 2, 2, 3]), ["cycle_trends"])  # a leak every other cycle


def test_a_group_leaked_per_cycle_fires_and_short_series_are_not_judged():
    assert check_log(_samples("live_groups/rank", list(range(20))), ["cycle_trends"])
    assert check_log(_samples("live_groups/rank", list(range(trends.MIN_CYCLES - 1))), ["cycle_trends"]) == []


def test_an_unknown_family_is_named():
    (v,) = check_log(_samples("heap/x", [1] * 6)[:1], ["cycle_trends"])
    assert "unknown family 'heap'" in v.message


def test_clean_simulated_run_is_flat_over_20_cycles():
    res = run(None, overrides=STEPS)
    judged = trends.trends(res.result.records)
    families = {t.series.split("/")[0] for t in judged}
    assert families == {"residue_bytes", "ipc_bytes", "live_groups", "refit_s"}
    assert all(t.ok and t.cycles >= 20 for t in judged), [t.describe() for t in judged if not t.ok]
    assert not [v for v in res.violations if v.invariant == "cycle_trends"]


@pytest.mark.parametrize(
    "fault,family",
    [("sleep_residue_grows", "residue_bytes"), ("staging_leak", "ipc_bytes"), ("refit_slows", "refit_s")],
)
def test_each_simulated_leak_class_fires_its_series(fault, family):
    res = run(None, overrides={**STEPS, "faults": [{"name": fault, "pipeline": "ppl1", "at_step": 2}]})
    fired = [v for v in res.violations if v.invariant == "cycle_trends"]
    assert fired and all(v.message.startswith(f"{family}/ppl1") for v in fired)


def test_the_residue_leak_stays_under_the_single_cycle_threshold():
    """The point of a trend: the post-sleep threshold (one cycle) never sees this leak."""
    res = run(None, overrides={**STEPS, "faults": [{"name": "sleep_residue_grows", "pipeline": "ppl1", "at_step": 2}]})
    assert {v.invariant for v in res.violations} == {"cycle_trends"}


def test_a_group_stranded_per_sync_grows_the_live_groups():
    res = run(STRANDED, overrides={"pipelines[0].steps": 24, "costs.nccl_buffer_bytes": 1 << 20})
    assert any(v.invariant == "cycle_trends" and v.message.startswith("live_groups/ppl1") for v in res.violations)
    clean = run(STRANDED, overrides={"pipelines[0].steps": 24, "costs.nccl_buffer_bytes": 1 << 20, "faults": []})
    assert not clean.violations
