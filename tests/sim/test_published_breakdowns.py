"""benchmarks/published_step_times.py's per-stage check: the published breakdowns it holds
match the scenarios of examples/published/, and its share check fires on a share more than
10 points off and only there (crafted stage times, no simulation: the comparison itself is a
printed benchmark, not a test)."""

from __future__ import annotations

import os

import pytest
import yaml

from tests.sim.benchmark_module import load_benchmark

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _bench():
    return load_benchmark("published_step_times")


def test_every_published_breakdown_has_its_scenario_and_fits_its_total():
    b = _bench()
    assert len(b.PUBLISHED_STAGES_S) >= 5
    for name, (total, stages) in b.PUBLISHED_STAGES_S.items():
        path = os.path.join(ROOT, "examples", "published", name + ".yaml")
        with open(path) as f:
            text = f.read()
        assert yaml.safe_load(text)["name"] == name
        assert "nvidia-nemo.github.io/blog/2025/07/21/nemo-rl-v0.3" in text  # the source is cited
        assert len(stages) == 4 and 0.9 * total <= sum(stages) <= total  # the columns fit the published total
        assert b.PUBLISHED_STEP_S[name][0] == total


def test_share_check_fires_on_a_stage_more_than_ten_points_off():
    b = _bench()
    name = "llama3.1_70b_grpo_v03_breakdown"  # published 147 s: 84 / 18 / 28 / 14 (57.1 / 12.2 / 19.0 / 9.5 %)
    same = {"generation": 84.0, "log_probs": 18.0, "training": 28.0, "refit": 14.0}
    assert b.share_misses(name, 147.0, same) == []
    # 30 s more of refit on a 177 s step: refit 24.9 % (15.4 points over), generation 47.5 % (9.6 under)
    skewed = dict(same, refit=44.0)
    misses = b.share_misses(name, 177.0, skewed)
    assert [m[0] for m in misses] == ["refit"]
    assert abs(misses[0][1] - 100 * 14 / 147) < 1e-9 and abs(misses[0][2] - 100 * 44 / 177) < 1e-9
    assert b.share_misses("llama3.1_8b_grpo_onpolicy", 92.8, same) == []  # totals-only source: nothing to check


def test_seconds_table_prints_published_beside_simulated(capsys):
    b = _bench()
    stages = {"generation": 60.0, "log_probs": 17.0, "training": 29.0, "refit": 4.0}
    b.print_seconds(
        [
            ("llama3.1_70b_grpo_v03_breakdown", 147.0, "v0.3", 110.0, stages),
            ("llama3.1_8b_grpo_onpolicy", 92.8, "v0.5", 90.0, stages),
        ]
    )
    out = capsys.readouterr().out
    assert "84.0 ->  60.0" in out and "14.0 ->   4.0" in out
    assert "llama3.1_8b_grpo_onpolicy" not in out  # totals only: no stage seconds published


def test_the_cap_share_what_if_keeps_each_scenarios_mean():
    from simulators.costmodel import formulas as f

    b = _bench()
    path = os.path.join(ROOT, "examples", "published", "llama3.1_70b_grpo_v03_breakdown.yaml")
    with open(path) as fh:
        w = yaml.safe_load(fh)["pipelines"][0]["workload"]
    mean = f.mean_decode_tokens(w["decode_tokens_median"], w["decode_tokens_sigma"], w["decode_tokens_max"])
    got = b.with_cap_share(path, 0.001).pipelines[0].workload
    assert got.decode_tokens_cap_share == 0.001 and got.decode_tokens_median < w["decode_tokens_median"]
    assert f.mean_decode_tokens(
        got.decode_tokens_median, got.decode_tokens_sigma, got.decode_tokens_max, 0.001
    ) == pytest.approx(mean, rel=1e-9)
