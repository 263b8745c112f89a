"""The ``single_controller`` pipeline type in the simulator: the pumps' guarantees read
back from the event log, the bundled scenarios, and the setup refusal."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml

from harness.logs.invariants import check_log
from harness.logs.outputs.summary import summarize
from harness.logs.outputs.summary_text import format_summary
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import load_scenario, scenario_from_mapping
from simulators.scenario.loader import ScenarioError

ROOT = Path(__file__).resolve().parents[2]
SCEN = ROOT / "examples" / "scenarios"


def sc_scenario(steps=4, seed=0, horizon=3600.0, faults=(), **streaming):
    stream = {"sampler": "in_order", "window": 1, "max_buffered_rollouts": 8}
    stream.update(streaming)
    data = {
        "name": "sc",
        "seed": seed,
        "horizon_s": horizon,
        "cluster": {"nodes": 1, "gpus_per_node": 2},
        "pipelines": [
            {
                "name": "sc",
                "type": "single_controller",
                "train_gpus": [0],
                "infer_gpus": [1],
                "steps": steps,
                "workload": {"prompts_per_step": 4, "generations_per_prompt": 2, "decode_tokens_sigma": 1.0},
                "streaming": stream,
            }
        ],
        "faults": list(faults),
    }
    return scenario_from_mapping(data, "test")


def ends(records, effect):
    return [r for r in records if r["kind"] == "effect_end" and r["effect"] == effect and not r.get("error")]


def trainer(records, action=None):
    return [r for r in records if r["kind"] == "trainer_step" and (action is None or r["action"] == action)]


def reserved_version(records):
    return {r["result"][0]: r["result"][1] for r in ends(records, "Reserve")}


@pytest.mark.parametrize("sampler", ["in_order", "weight_fifo", "windowed", "ready_first"])
def test_every_sampler_runs_clean_and_the_version_ticks_at_finish_only(sampler):
    res = Simulation(sc_scenario(steps=4, sampler=sampler)).run()
    assert res.reason == "done", res.detail
    assert check_log(res.records) == []
    recs = trainer(res.records)
    prev = 0
    for r in recs:  # the trainer's own record of every call
        assert r["version"] == (prev + 1 if r["action"] == "finish" else prev), r
        prev = r["version"]
    assert [r["version"] for r in trainer(res.records, "finish")] == [1, 2, 3, 4]
    assert [r["step"] for r in trainer(res.records, "begin")] == [0, 1, 2, 3]
    assert [r["args"]["version"] for r in ends(res.records, "SyncWeights")] == [1, 2, 3, 4]


def test_strict_on_policy_trains_only_groups_generated_by_the_current_weights():
    res = Simulation(sc_scenario(steps=4, sampler="windowed", window=0)).run()
    assert res.reason == "done" and check_log(res.records) == []
    start = reserved_version(res.records)
    version = 0
    trained = 0
    for r in trainer(res.records):
        if r["action"] == "microbatch":
            assert all(start[g] == version for g in r["groups"]), (r, version)
            trained += len(r["groups"])
        version = r["version"]
    assert trained == 16
    # groups generated under weights that moved on were dropped, never trained
    assert (
        sum(len(r["result"]) for r in ends(res.records, "AbortStaleInflight"))
        + sum(len(r.get("result") or []) for r in ends(res.records, "Evict"))
        > 0
    )


def test_one_clear_per_step_when_the_step_trains_as_one_batch_and_one_per_group_streaming():
    batch = Simulation(sc_scenario(steps=3, min_groups_for_streaming_train=4)).run()
    clears = ends(batch.records, "ClearSamples")
    assert [(r["args"]["step"], len(r["args"]["groups"])) for r in clears] == [(0, 4), (1, 4), (2, 4)]
    stream = Simulation(sc_scenario(steps=3, min_groups_for_streaming_train=1)).run()
    cleared = Counter(g for r in ends(stream.records, "ClearSamples") for g in r["args"]["groups"])
    trained = Counter(g for r in trainer(stream.records, "microbatch") for g in r["groups"])
    assert cleared == trained and set(cleared.values()) == {1} and len(cleared) == 12
    assert check_log(batch.records) == [] and check_log(stream.records) == []


def test_arrival_order_is_the_training_order_in_the_long_tail():
    res = Simulation(sc_scenario(steps=4, sampler="windowed", window=1)).run()
    commits = [r["args"]["group_id"] for r in ends(res.records, "Commit")]
    trained = [g for r in trainer(res.records, "microbatch") for g in r["groups"]]
    reserved = [r["result"][0] for r in ends(res.records, "Reserve")]
    assert commits != sorted(commits), "the long tail should reorder arrivals"
    assert trained == [g for g in commits if g in set(trained)]  # trained in arrival order
    assert trained != [g for g in reserved if g in set(trained)]


def test_training_overlaps_the_long_tail_of_generation():
    res = Simulation(sc_scenario(steps=4, sampler="in_order", window=0, min_groups_for_streaming_train=1)).run()
    gen = [
        (r["t"], r["args"]["group_id"])
        for r in res.records
        if r["kind"] == "effect_start" and r["effect"] == "Generate"
    ]
    gen_end = {r["args"]["group_id"]: r["t"] for r in ends(res.records, "Generate")}
    mb_starts = [r["t"] for r in res.records if r["kind"] == "effect_start" and r["effect"] == "TrainMicrobatches"]
    overlapped = sum(1 for t in mb_starts if any(s <= t < gen_end.get(g, 0) for s, g in gen))
    assert overlapped >= len(mb_starts) // 2, (overlapped, len(mb_starts))


def test_failed_rollouts_retry_then_skip_and_the_step_trains_on_fewer_groups():
    res = Simulation(
        sc_scenario(
            steps=5,
            sampler="windowed",
            window=1,
            infra_failure_rate=0.35,
            data_failure_rate=0.15,
            max_infra_attempts_per_prompt=2,
            max_data_attempts_per_prompt=1,
        )
    ).run()
    assert res.reason == "done", res.detail
    assert check_log(res.records) == []
    removed = Counter(r["args"]["reason"] for r in ends(res.records, "RemoveGroup"))
    assert removed["infra"] > 0 and removed["data"] > 0
    skipped = ends(res.records, "SkipPrompt")
    assert skipped
    per_step = defaultdict(int)
    for r in trainer(res.records, "microbatch"):
        per_step[r["step"]] += len(r["groups"])
    assert all(n <= 4 for n in per_step.values())
    assert ends(res.records, "Backoff")  # infra failures back off before the retry


def test_capacity_deadlock_is_refused_at_load_time_and_would_really_deadlock(tmp_path, monkeypatch, capsys):
    with pytest.raises(
        ScenarioError,
        match=r"pipelines\[0\]\.streaming\.max_buffered_rollouts: max_buffered_rollouts 3 "
        r"is below the 8 groups the in_order sampler needs .*deadlock",
    ):
        sc_scenario(max_buffered_rollouts=3, min_groups_for_streaming_train=4)
    path = tmp_path / "dead.yaml"
    good = sc_scenario()
    from simulators.scenario.dump import scenario_to_mapping

    data = scenario_to_mapping(good)
    data["pipelines"][0]["streaming"]["max_buffered_rollouts"] = 3
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    from rlharness.cli import main  # the command in-process (tests/replay: the same contract in a real process)

    capsys.readouterr()
    assert main(["simulate", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "max_buffered_rollouts" in err and "deadlock" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()
    # without the setup check the same configuration stalls: the step's 4th group never gets a slot
    import harness.streaming.controller as controller

    monkeypatch.setattr(controller, "check_capacity", lambda *a: None)
    spec = good.pipelines[0]
    stuck = dataclasses.replace(
        spec,
        streaming=dataclasses.replace(
            spec.streaming,
            max_buffered_rollouts=3,
            min_groups_for_streaming_train=4,
            stall_timeout_s=120.0,
            watchdog_interval_s=30.0,
        ),
    )
    res = Simulation(dataclasses.replace(good, pipelines=(stuck,), horizon_s=900.0)).run()
    assert res.reason == "horizon" and trainer(res.records) == []
    assert [r for r in res.records if r["kind"] == "stall"]


def test_bundled_streaming_vs_batch_shows_the_step_time_difference():
    res = Simulation(load_scenario(SCEN / "streaming_vs_batch.yaml")).run()
    assert res.reason == "done" and check_log(res.records) == []
    summary = summarize(res.records)
    mean = {p.pipeline_id: p.mean_step_s for p in summary.pipelines}
    assert mean["stream"] < mean["batch"]
    # every trajectory both controllers trained, by age in versions: within the in_order window of 1
    assert sum(summary.staleness.values()) == 2 * 6 * 8 * 4 and set(summary.staleness) <= {0, 1}
    text = format_summary(summary)
    assert "Streaming single controllers (step time vs the batch controller batch)" in text
    d = mean["stream"] - mean["batch"]
    assert f"{d:+.3f} s ({100 * d / mean['batch']:+.1f} %)" in text
    # the same workload: each prompt's first attempt decodes for the same time in both
    dur = defaultdict(dict)
    starts = {
        (r["pipeline_id"], r["args"]["group_id"]): r["t"]
        for r in res.records
        if r["kind"] == "effect_start" and r["effect"] == "Generate"
    }
    for r in ends(res.records, "Generate"):
        if r["args"]["attempt"] == 0 and r["result"] == "ok":
            dur[r["args"]["prompt_id"]][r["pipeline_id"]] = round(
                r["t"] - starts[(r["pipeline_id"], r["args"]["group_id"])], 6
            )
    both = [d for d in dur.values() if len(d) == 2]
    assert len(both) >= 40 and all(d["stream"] == d["batch"] for d in both)


def test_bundled_lost_finish_is_caught_by_streaming_step_and_clean_without_the_fault():
    s = load_scenario(SCEN / "lost_finish.yaml")
    res = Simulation(s).run()
    assert res.reason == "failed" and "begin_train_step(2) while step 1 is open" in res.detail
    found = [v for v in check_log(res.records) if v.invariant != "run_outcome"]  # the failed run is run_outcome's
    assert [v.invariant for v in found] == ["streaming_step"]
    assert "syncs weights version 2 but the trainer holds version 1" in found[0].message
    clean = Simulation(dataclasses.replace(s, faults=())).run()
    assert clean.reason == "done" and check_log(clean.records) == []


def test_single_controller_must_not_share_gpus_and_streaming_is_its_own():
    with pytest.raises(ScenarioError, match="non-colocated"):
        scenario_from_mapping(
            {
                "name": "x",
                "cluster": {"gpus_per_node": 2},
                "pipelines": [{"name": "a", "type": "single_controller", "train_gpus": [0], "infer_gpus": [0, 1]}],
            },
            "x",
        )
    with pytest.raises(ScenarioError, match=r"pipelines\[0\]\.streaming: only a single_controller"):
        scenario_from_mapping(
            {
                "name": "x",
                "cluster": {"gpus_per_node": 2},
                "pipelines": [
                    {"name": "a", "type": "nemo_async", "train_gpus": [0], "infer_gpus": [0, 1], "streaming": {}}
                ],
            },
            "x",
        )
    with pytest.raises(ScenarioError, match=r"streaming\.sampler: unknown sampler 'lifo'"):
        sc_scenario(sampler="lifo")
