"""Disaggregated pipelines in the simulator: each order's staleness as the order defines it,
the weight-sync modes seen in the log (a paused sync completes nothing, an in-flight one
does, a partial rollout spans versions, a drained one never), asynchronous steps shorter
than synchronous ones on a long-tailed workload, the oracle clean, and bad input refused in
one line naming the field."""

from __future__ import annotations

import pytest

from harness.logs.invariants import check_log
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import ScenarioError, scenario_from_mapping


def _scenario(shape="sync", weight_sync="pause", steps=4, batching="completion", **pipe):
    p = {
        "name": "p",
        "type": "disaggregated",
        "train_gpus": [0, 1],
        "infer_gpus": [2, 3],
        "steps": steps,
        "disaggregated": {"shape": shape, "weight_sync": weight_sync, "batching": batching},
        "model": {"preset": "qwen2.5-1.5b"},
        "workload": {
            "prompts_per_step": 8,
            "generations_per_prompt": 4,
            "prompt_tokens": 64,
            "decode_tokens_median": 256,
            "decode_tokens_sigma": 1.0,
            "decode_tokens_max": 2048,
            "max_trajectory_age_steps": 1,
        },
        **pipe,
    }
    return scenario_from_mapping(
        {
            "name": "s",
            "horizon_s": 5000,
            "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "h100_sxm"},
            "pipelines": [p],
        },
        "t.yaml",
    )


def _run(**kw):
    res = Simulation(_scenario(**kw)).run()
    assert res.reason == "done", res.detail
    assert check_log(res.records) == []
    return res.records


def _kind(records, kind):
    return [r for r in records if r["kind"] == kind]


def _intervals(records, effect):
    start, out = None, []
    for r in records:
        if r["kind"] in ("effect_start", "effect_end") and r["effect"] == effect:
            if r["kind"] == "effect_start":
                start = r["t"]
            else:
                out.append((start, r["t"]))
    return out


def _mean_step(records):
    starts = sorted(
        {r["step"]: r["t"] for r in reversed(_kind(records, "effect_start")) if r.get("scope") == "step"}.items()
    )
    return (starts[-1][1] - starts[0][1]) / (len(starts) - 1)


def test_staleness_is_what_each_order_allows():
    ages = {
        shape: [r["staleness"] for r in _kind(_run(shape=shape), "batch_consumed")]
        for shape in ("sync", "one_step_off")
    }
    assert ages["sync"] == [{"0": 32}] * 4
    assert ages["one_step_off"] == [{"0": 32}] + [{"1": 32}] * 3  # every batch after the first one version old
    for r in _kind(_run(shape="fully_async"), "batch_consumed"):
        assert set(r["staleness"]) <= {"0", "1"} and r["trajectories"] == 32


def test_a_paused_sync_completes_nothing_and_its_partial_rollouts_span_versions():
    records = _run(shape="fully_async", weight_sync="pause")
    syncs = _intervals(records, "SyncWeights")
    done_in_sync = [r for r in _kind(records, "trajectory") if any(a < r["t"] < b for a, b in syncs)]
    assert done_in_sync == []
    assert any(r["version"] > r["first_version"] for r in _kind(records, "trajectory"))


def test_a_drained_sync_leaves_no_trajectory_across_versions():
    records = _run(shape="fully_async", weight_sync="drain")
    assert all(r["version"] == r["first_version"] for r in _kind(records, "trajectory"))
    gens = _intervals(records, "Generate")
    for a, b in _intervals(records, "SyncWeights"):
        assert not any(s < b and e > a for s, e in gens)  # no rank generates during the sync


def test_an_in_flight_sync_lets_generation_run_under_it():
    records = _run(shape="fully_async", weight_sync="in_flight")
    assert not [r for r in _kind(records, "effect_start") if r["effect"] == "PauseGeneration"]
    syncs = _intervals(records, "SyncWeights")
    assert any(any(a < r["t"] < b for a, b in syncs) for r in _kind(records, "trajectory"))


def test_asynchronous_steps_are_shorter_than_synchronous_ones_on_a_long_tail():
    sync, off, full = (_mean_step(_run(shape=s, steps=5)) for s in ("sync", "one_step_off", "fully_async"))
    assert off < sync and full < sync


def _dispatch_order(records):
    return [r["trajectory"] for r in _kind(records, "trajectory_dispatch")]


def test_target_batching_trains_step_k_on_the_kth_batch_started():
    """NeMo RL's replay buffer: step k's batch is the prompt groups generated for step k
    (the k-th 32 trajectories dispatched), so its wait ends with the last of those, and no
    trajectory is generated that is not trained."""
    records = _run(shape="fully_async", weight_sync="in_flight", batching="target")
    order, done = _dispatch_order(records), {r["trajectory"]: r["t"] for r in _kind(records, "trajectory")}
    consumed = _kind(records, "batch_consumed")
    assert len(order) == len(done) == 4 * 32 and not _kind(records, "trajectory_evicted")
    for k, r in enumerate(consumed):
        assert r["t"] == max(done[t] for t in order[32 * k : 32 * (k + 1)])
        assert set(r["staleness"]) <= {"0", "1"}


@pytest.mark.parametrize("weight_sync", ["drain", "pause"])
def test_target_batching_starts_no_group_while_a_sync_holds_generation(weight_sync):
    """NeMo RL without in-flight updates: prepare_for_refit holds new prompt groups, and a
    drained sync leaves every answer on one version."""
    records = _run(shape="fully_async", weight_sync=weight_sync, batching="target")
    starts = lambda effect: [r["t"] for r in _kind(records, "effect_start") if r["effect"] == effect]  # noqa: E731
    held = list(zip(starts("PauseGeneration"), starts("ResumeGeneration")))
    assert held and not [r for r in _kind(records, "trajectory_dispatch") if any(a <= r["t"] < b for a, b in held)]
    if weight_sync == "drain":
        assert all(r["version"] == r["first_version"] for r in _kind(records, "trajectory"))


def _most_in_flight(records):
    running = most = 0
    for r in records:
        running += {"trajectory_dispatch": 1, "trajectory": -1}.get(r["kind"], 0)
        most = max(most, running)
    return most


def test_target_batching_holds_at_most_a_window_of_prompt_groups_in_flight():
    """NeMo RL's collector runs at most prompts_per_step x max_trajectory_age_steps prompt
    groups at once (8 x 1 x 4 answers here); the completion window lets two batches run."""
    target = _run(shape="fully_async", weight_sync="in_flight", batching="target")
    completion = _run(shape="fully_async", weight_sync="in_flight")
    assert _most_in_flight(target) == 32 < _most_in_flight(completion)


@pytest.mark.parametrize(
    "pipe, message",
    [
        (
            {"disaggregated": {"shape": "two_step_off"}},
            "pipelines[0].disaggregated.shape: unknown shape 'two_step_off'",
        ),
        (
            {"disaggregated": {"shape": "fully_async", "weight_sync": "later"}},
            "pipelines[0].disaggregated.weight_sync: unknown mode 'later'",
        ),
        (
            {"shape": "fully_async", "batching": "fifo"},
            "pipelines[0].disaggregated.batching: unknown batching 'fifo'",
        ),
        ({"batching": "target"}, "pipelines[0].disaggregated.batching: only fully_async makes its batch by target"),
        ({"infer_gpus": [1, 2, 3]}, "pipelines[0].train_gpus: train GPUs [1] are also infer_gpus"),
        ({"type": "roll_sync", "train_gpus": [2]}, "pipelines[0].disaggregated: only a disaggregated pipeline"),
    ],
)
def test_bad_disaggregated_input_is_one_line_naming_the_field(pipe, message):
    with pytest.raises(ScenarioError) as e:
        _scenario(**pipe)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_no_other_pipeline_may_use_a_disaggregated_pipelines_gpus():
    from simulators.scenario.loader import check_feasible

    s = _scenario()
    data = {
        "name": "s",
        "horizon_s": 5000,
        "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "h100_sxm"},
        "pipelines": [
            {
                "name": "p",
                "type": "disaggregated",
                "train_gpus": [0],
                "infer_gpus": [1],
                "model": {"preset": "qwen2.5-1.5b"},
            },
            {
                "name": "rl",
                "type": "roll_sync",
                "train_gpus": [1],
                "infer_gpus": [1, 2],
                "model": {"preset": "qwen2.5-1.5b"},
            },
        ],
    }
    with pytest.raises(ScenarioError) as e:
        check_feasible(scenario_from_mapping(data, "t.yaml"), "t.yaml")
    assert "pipelines[1].train_gpus: GPU(s) [1] also belong to pipeline 'p'; disaggregated 'p' owns" in str(e.value)
    check_feasible(s, "t.yaml")  # alone, the same pipeline is fine
