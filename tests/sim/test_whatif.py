"""What-if runs: ``simulate --set``, ``sweep`` and ``diff``."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import yaml

from harness.logs.outputs.run_diff import diff_rows, format_diff
from rlharness.cli import main
from simulators.scenario.overrides import OverrideError, apply_overrides, parse_override, parse_path, split_values
from simulators.whatif.compare import aggregate
from simulators.whatif.grid import Variant


def test_paths_read_as_error_messages_write_them():
    assert parse_path("pipelines[1].model.params") == (
        ("key", "pipelines"),
        ("index", 1),
        ("key", "model"),
        ("key", "params"),
    )
    assert parse_path("pipelines[ppl2].steps") == (("key", "pipelines"), ("named", "ppl2"), ("key", "steps"))
    for bad in ("[0].steps", "pipelines..steps", "pipelines.", "pipelines[0]steps", "a b"):
        with pytest.raises(OverrideError):
            parse_path(bad)


def test_values_are_yaml_and_lists_keep_their_commas():
    assert parse_override("pipelines[0].infer_gpus=[0, 1]").value == [0, 1]
    assert parse_override("model.params=7e9").value == 7e9
    assert parse_override("scheduler.head_of_line_blocking=true").value is True
    assert split_values("1,2,[0,1],{a: 1, b: 2},'x,y'") == ["1", "2", "[0,1]", "{a: 1, b: 2}", "'x,y'"]


def test_overrides_change_a_copy_and_create_missing_mappings():
    base = {"name": "s", "pipelines": [{"name": "a", "steps": 1}, {"name": "b", "steps": 2}]}
    out = apply_overrides(base, [parse_override("pipelines[b].steps=9"), parse_override("costs.wake_s=2")])
    assert out["pipelines"][1]["steps"] == 9 and out["costs"] == {"wake_s": 2}
    assert base["pipelines"][1]["steps"] == 2 and "costs" not in base
    with pytest.raises(OverrideError, match="no item 5"):
        apply_overrides(base, [parse_override("pipelines[5].steps=1")])
    with pytest.raises(OverrideError, match="no item named 'c'"):
        apply_overrides(base, [parse_override("pipelines[c].steps=1")])


def test_simulate_set_reaches_the_resolved_scenario(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "simulate",
                "--quiet",
                "--no-png",
                "--out",
                str(out),
                "--set",
                "pipelines[ppl2].steps=2",
                "--set",
                "costs.wake_s=1.25",
            ]
        )
        == 0
    )
    resolved = yaml.safe_load((out / "scenario.yaml").read_text())
    assert resolved["costs"]["wake_s"] == 1.25
    assert [p["steps"] for p in resolved["pipelines"]] == [4, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert {p["pipeline_id"]: p["steps_done"] for p in summary["pipelines"]} == {"ppl1": 4, "ppl2": 2}


@pytest.mark.parametrize(
    "flag, message",
    [
        ("pipelines[0].steps=-1", "pipelines[0].steps: must be > 0"),
        ("pipelines[7].steps=1", "--set pipelines[7].steps: pipelines has 2 item(s), no item 7"),
        ("costs.wake_s=[1", "--set costs.wake_s: the value '[1' is not valid YAML"),
        ("nosuch=1", "nosuch: unknown field"),
        ("steps", "--set steps: expected PATH=VALUE"),
        (
            "costs.kv_cache_fraction=1.0",
            "kv_cache_fraction",
        ),  # valid alone, infeasible as a layout (docs/feasibility.md)
    ],
)
def test_a_bad_set_is_one_line_and_nothing_written(tmp_path, capsys, flag, message):
    out = tmp_path / "run"
    assert main(["simulate", "--quiet", "--out", str(out), "--set", flag]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def _sweep(tmp_path, name, *extra):
    out = tmp_path / name
    code = main(
        [
            "sweep",
            "--quiet",
            "--no-png",
            "--set",
            "pipelines[ppl1].steps=1,2",
            "--set",
            "costs.wake_s=0.5",
            "--seeds",
            "2",
            "--out",
            str(out),
            *extra,
        ]
    )
    return code, out


def test_sweep_results_are_the_same_bytes_for_any_worker_count(tmp_path, capsys):
    code1, one = _sweep(tmp_path, "one", "--workers", "1")
    code2, two = _sweep(tmp_path, "two", "--workers", "2")
    assert code1 == code2 == 0
    assert (one / "results.json").read_bytes() == (two / "results.json").read_bytes()
    data = json.loads((one / "results.json").read_text())
    assert [v["settings"] for v in data["variants"]] == [
        {"pipelines[ppl1].steps": 1, "costs.wake_s": 0.5},
        {"pipelines[ppl1].steps": 2, "costs.wake_s": 0.5},
    ]
    assert [(r["variant"], r["run_seed"]) for r in data["runs"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [v["pipelines"]["ppl1"]["steps_done"] for v in data["variants"]] == [1, 2]
    assert "v1" in (one / "table.txt").read_text()


def test_sweep_validates_every_variant_before_running(tmp_path, capsys):
    out = tmp_path / "bad"
    assert main(["sweep", "--quiet", "--set", "pipelines[0].steps=2,0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "pipelines[0].steps=0" in err and "must be > 0" in err
    assert not out.exists()


def test_sweep_figures_against_an_independent_computation():
    steps = {0: [10.0, 12.0, 20.0], 1: [11.0, 13.0]}  # seed -> step times of one pipeline
    runs = [
        {
            "status": "ok",
            "variant": 0,
            "run_seed": s,
            "seed": s,
            "end": "done",
            "busy_pct": 90.0 + s,
            "idle_pct": 10.0 - s,
            "findings": {"handover": 1},
            "pipelines": {
                "p": {"steps_done": len(t), "step_times": t, "refit_s": 1.0, "waiting_s": 0.0, "mean_age_steps": 0.5}
            },
        }
        for s, t in steps.items()
    ]
    (agg,) = aggregate([Variant(0, (), {})], runs)
    means = [np.mean(t) for t in steps.values()]
    pooled = np.concatenate([np.array(t) for t in steps.values()])
    p = agg["pipelines"]["p"]
    assert math.isclose(p["mean_step_s"], np.mean(means))
    assert math.isclose(p["mean_step_sd"], np.std(means, ddof=1))
    assert p["p95_step_s"] == np.percentile(pooled, 95, method="inverted_cdf")
    assert agg["idle_pct"] == 9.5 and agg["findings"] == {"handover": 2} and agg["end"] == {"done": 2}


def test_diff_pairs_pipelines_and_gives_deltas(tmp_path, capsys):
    a = {
        "scenario": "s",
        "run": {"simulated_s": 100.0},
        "gpus_all": {"idle_pct": 10.0},
        "pipelines": [{"pipeline_id": "p1", "mean_step_s": 10.0, "steps_done": 4}],
    }
    b = {
        "scenario": "s",
        "run": {"simulated_s": 80.0},
        "gpus_all": {"idle_pct": 10.0},
        "pipelines": [
            {"pipeline_id": "p1", "mean_step_s": 12.5, "steps_done": 4},
            {"pipeline_id": "p2", "mean_step_s": 3.0, "steps_done": 1},
        ],
    }
    sections = dict(diff_rows(a, b))
    assert ("simulated s", 100.0, 80.0) in sections["run"]
    assert ("mean step s", 10.0, 12.5) in sections["pipeline p1"]
    assert ("mean step s", None, 3.0) in sections["pipeline p2"]
    text = format_diff(diff_rows(a, b), "A", "B", changed_only=True)
    assert "+25.0 %" in text and "-20.0 %" in text and "GPU idle" not in text
    for name, data in (("a", a), ("b", b)):
        os.makedirs(tmp_path / name)
        (tmp_path / name / "summary.json").write_text(json.dumps(data))
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "pipeline p2" in capsys.readouterr().out
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "nope")]) == 2
    assert "RUN_B" in capsys.readouterr().err


def test_a_sweep_run_counts_known_upstream_behaviour_apart():
    """``known:<check>`` beside the findings, as simulate's verdict reads them; with
    ``--upstream-as-findings`` they are findings again."""
    from simulators.scenario.yaml_dialect import strict_safe_load
    from simulators.whatif.one_run import run_one

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "scenarios", "roll_dual_4gpu.yaml")
    with open(path, encoding="utf-8") as fh:
        mapping = strict_safe_load(fh.read())
    assert run_one(0, 0, mapping, path, 0)["findings"] == {"known:planned_release_ack": 2}
    assert run_one(0, 0, mapping, path, 0, True)["findings"] == {"planned_release_ack": 2}
