"""The ``colocated_ipc`` refit path (standalone NeMo RL's CUDA-IPC refit): its closed form
against a hand computation, the simulator charging exactly that, the oracle clean on a run
that takes it, the path faster than the CPU bucket cache for the same model, and a bad value
refused in one line naming the field."""

from __future__ import annotations

import pytest

from harness.invariants import check_log
from simulators.costmodel import formulas as f
from simulators.costmodel.hardware import GPU_PRESETS
from simulators.runtime import Simulation
from simulators.scenario import ScenarioError, scenario_from_mapping

COSTS = {"refit_group_overhead_s": 0.004, "refit_tensor_overhead_s": 0.001, "refit_setup_s": 0.01,
         "refit_complete_s": 0.02, "bucket_bytes": 1 << 30}


def _scenario(refit_path=None, **pipe):
    p = {"name": "p", "type": "roll_sync", "train_gpus": list(range(4)), "infer_gpus": list(range(4)), "infer_tp": 2,
         "steps": 1, "sleep_level": 1, "model": {"preset": "qwen2.5-1.5b"},
         "workload": {"prompts_per_step": 4, "generations_per_prompt": 4, "prompt_tokens": 64,
                      "decode_tokens_median": 64, "decode_tokens_max": 256},
         **({"refit_path": refit_path} if refit_path else {}), **pipe}
    return scenario_from_mapping({"name": "s", "horizon_s": 2000, "cluster": {"nodes": 1, "gpus_per_node": 4,
                                                                            "gpu": "h100_sxm"},
                                  "costs": COSTS, "pipelines": [p]}, "t.yaml")


def _effect_s(records, effect):
    """Seconds each completed ``effect`` took, in order (one pipeline: start and end pair
    up by the pipeline and the effect's args)."""
    start, out = {}, []
    for r in records:
        if r["kind"] in ("effect_start", "effect_end") and r["effect"] == effect:
            key = (r["pipeline_id"], repr(r["args"]))
            if r["kind"] == "effect_start":
                start[key] = r["t"]
            else:
                out.append(r["t"] - start.pop(key))
    return out


def _sync_s(records):
    start, out = None, []
    for r in records:
        if r["kind"] == "sync_start":
            start = r["t"]
        elif r["kind"] == "sync_end":
            out.append(r["t"] - start)
    return out


@pytest.fixture(scope="module")
def runs():
    return {path: Simulation(_scenario(path)).run().records for path in ("cpu_cache", "colocated_ipc")}


def test_the_closed_form_against_a_hand_computation():
    # 1e9 bytes in 3e8-byte groups: 4 groups (3e8, 3e8, 3e8, 1e8). At 2e12 B/s x 0.5 each
    # copy moves 2 bytes per byte (read + write): pack 2e9 / 1e12 = 2 ms, load 2 ms;
    # overheads 4 x (2 x 1 ms + 2 ms) = 16 ms; fixed 100 ms. Total 0.120 s.
    assert f.colocated_ipc_refit_s(1e9, 300_000_000, 2e12, 0.5, 0.001, 0.002, 0.1) == pytest.approx(0.120)
    assert f.colocated_ipc_refit_s(1e9, 1 << 40, 2e12, 0.5) == pytest.approx(0.004)  # one group, no overheads
    assert "b1c86a816c5e2b4ca41ece193624a38dc62e6fdf" in f.NEMO_RL_IPC_REFIT_SOURCE


def test_the_simulator_charges_the_closed_form_and_writes_ipc_buckets_only(runs):
    s = _scenario("colocated_ipc")
    c = s.pipelines[0].costs
    expected = f.colocated_ipc_refit_s(s.pipelines[0].model.weight_bytes, c.bucket_bytes,
                                       GPU_PRESETS["h100_sxm"].hbm_bytes_per_s, c.hbm_efficiency,
                                       c.refit_tensor_overhead_s, c.refit_group_overhead_s,
                                       c.refit_setup_s + c.refit_complete_s)
    recs = runs["colocated_ipc"]
    syncs = _sync_s(recs)
    assert syncs and all(t == pytest.approx(expected, rel=1e-9) for t in syncs)
    buckets = [r for r in recs if r["kind"] == "sync_bucket"]
    assert buckets and {r["path"] for r in buckets} == {"ipc"}
    assert not [r for r in recs if r["kind"] == "group_create" and r.get("purpose") == "sync"]


def test_the_oracle_is_clean_and_the_path_is_faster_than_the_cache(runs):
    for path, recs in runs.items():
        assert check_log(recs) == [], path
    cache, ipc = runs["cpu_cache"], runs["colocated_ipc"]
    refit = {path: sum(_sync_s(r)) + sum(_effect_s(r, "BuildCache")) for path, r in runs.items()}
    assert refit["colocated_ipc"] < 0.5 * refit["cpu_cache"], refit
    assert sum(_effect_s(ipc, "BuildCache")) == 0.0 < sum(_effect_s(cache, "BuildCache"))


@pytest.mark.parametrize("pipe, message", [
    ({"refit_path": "nccl"}, "pipelines[0].refit_path: must be one of cpu_cache, colocated_ipc, got 'nccl'"),
    ({"refit_path": "colocated_ipc", "type": "nemo_async", "train_gpus": [0], "infer_gpus": [0, 1, 2, 3]},
     "pipelines[0].refit_path: colocated_ipc needs a trainer on every inference GPU; infer GPUs [1, 2, 3]"),
])
def test_a_bad_refit_path_is_one_line_naming_the_field(pipe, message):
    with pytest.raises(ScenarioError) as e:
        _scenario(**pipe)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_colocated_ipc_needs_a_gpu_preset():
    data = {"name": "s", "cluster": {"nodes": 1, "gpus_per_node": 2},
            "pipelines": [{"name": "p", "type": "roll_sync", "train_gpus": [0, 1], "infer_gpus": [0, 1],
                           "refit_path": "colocated_ipc"}]}
    with pytest.raises(ScenarioError) as e:
        scenario_from_mapping(data, "t.yaml")
    assert "pipelines[0].refit_path: colocated_ipc needs cluster.gpu" in str(e.value)
