"""The ``colocated_ipc`` refit path (standalone NeMo RL's CUDA-IPC refit): its closed form
against a hand computation, the simulator charging exactly that, the oracle clean on a run
that takes it, the path faster than the CPU bucket cache for the same model, and a bad value
refused in one line naming the field."""

from __future__ import annotations

import pytest

from harness.logs.invariants import check_log
from simulators.costmodel import formulas as f
from simulators.costmodel import refit_formulas as rf
from simulators.costmodel.hardware import GPU_PRESETS
from simulators.runtime.simulation import Simulation
from simulators.scenario.loader import ScenarioError, scenario_from_mapping

COSTS = {
    "refit_group_overhead_s": 0.004,
    "refit_tensor_overhead_s": 0.001,
    "refit_setup_s": 0.01,
    "refit_complete_s": 0.02,
    "bucket_bytes": 1 << 30,
}


def _scenario(refit_path=None, **pipe):
    p = {
        "name": "p",
        "type": "roll_sync",
        "train_gpus": list(range(4)),
        "infer_gpus": list(range(4)),
        "infer_tp": 2,
        "steps": 1,
        "sleep_level": 1,
        "model": {"preset": "qwen2.5-1.5b"},
        "workload": {
            "prompts_per_step": 4,
            "generations_per_prompt": 4,
            "prompt_tokens": 64,
            "decode_tokens_median": 64,
            "decode_tokens_max": 256,
        },
        **({"refit_path": refit_path} if refit_path else {}),
        **pipe,
    }
    return scenario_from_mapping(
        {
            "name": "s",
            "horizon_s": 2000,
            "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "h100_sxm"},
            "costs": COSTS,
            "pipelines": [p],
        },
        "t.yaml",
    )


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
    assert rf.colocated_ipc_refit_s(1e9, 300_000_000, 2e12, 0.5, 0.001, 0.002, 0.1) == pytest.approx(0.120)
    assert rf.colocated_ipc_refit_s(1e9, 1 << 40, 2e12, 0.5) == pytest.approx(0.004)  # one group, no overheads
    assert "b1c86a816c5e2b4ca41ece193624a38dc62e6fdf" in rf.NEMO_RL_IPC_REFIT_SOURCE


def test_the_simulator_charges_the_closed_form_and_writes_ipc_buckets_only(runs):
    s = _scenario("colocated_ipc")
    c = s.pipelines[0].costs
    expected = rf.colocated_ipc_refit_s(
        s.pipelines[0].model.weight_bytes,
        c.bucket_bytes,
        GPU_PRESETS["h100_sxm"].hbm_bytes_per_s,
        c.hbm_efficiency,
        c.refit_tensor_overhead_s,
        c.refit_group_overhead_s,
        c.refit_setup_s + c.refit_complete_s,
    )
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


@pytest.mark.parametrize(
    "pipe, message",
    [
        ({"refit_path": "nccl"}, "pipelines[0].refit_path: must be one of cpu_cache, colocated_ipc, got 'nccl'"),
        (
            {"refit_path": "colocated_ipc", "type": "nemo_async", "train_gpus": [0], "infer_gpus": [0, 1, 2, 3]},
            "pipelines[0].refit_path: colocated_ipc needs a trainer on every inference GPU; infer GPUs [1, 2, 3]",
        ),
    ],
)
def test_a_bad_refit_path_is_one_line_naming_the_field(pipe, message):
    with pytest.raises(ScenarioError) as e:
        _scenario(**pipe)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_colocated_ipc_needs_a_gpu_preset():
    data = {
        "name": "s",
        "cluster": {"nodes": 1, "gpus_per_node": 2},
        "pipelines": [
            {
                "name": "p",
                "type": "roll_sync",
                "train_gpus": [0, 1],
                "infer_gpus": [0, 1],
                "refit_path": "colocated_ipc",
            }
        ],
    }
    with pytest.raises(ScenarioError) as e:
        scenario_from_mapping(data, "t.yaml")
    assert "pipelines[0].refit_path: colocated_ipc needs cluster.gpu" in str(e.value)


# ----------------------------------------------------------------- the gather before the hand-over
_E = f.Efficiency(0.35, 0.5, 0.8, 10e-6, 256, 0.0, 0.0)
_LINKS = f.Links(400e9, 100e9, 8)  # NVLink 400 GB/s, 100 GB/s of NIC per GPU, 8 GPUs a node


def test_the_gather_against_a_hand_computation():
    dense = f.Arch(1e9, 1e9, 8, 1024, 256, 2)  # W = 2e9 bytes
    # TP2 PP2 on 16 GPUs: TP pairs inside a node (2e9 x 1/2 / 400e9 = 2.5 ms); a PP group is
    # GPUs g and g + 8, across nodes (span 9 > 8): the whole tensor 2e9 / 100e9 = 20 ms with
    # gather_params, the TP shard 1e9 / 100e9 = 10 ms with megatron_bridge
    v03 = rf.refit_gather_s(dense, f.Parallel(tp=2, pp=2), 16, _LINKS, _E, "gather_params")
    assert (v03["tp"], v03["pp"], v03["ep"]) == pytest.approx((2.5e-3, 20e-3, 0.0))
    assert v03["total"] == pytest.approx(22.5e-3)
    assert rf.refit_gather_s(dense, f.Parallel(tp=2, pp=2), 16, _LINKS, _E)["pp"] == pytest.approx(10e-3)
    # the same on 8 GPUs: the PP group (g, g + 4) stays in the node, 2e9 / 400e9 = 5 ms
    assert rf.refit_gather_s(dense, f.Parallel(tp=2, pp=2), 8, _LINKS, _E, "gather_params")["pp"] == pytest.approx(5e-3)
    assert rf.refit_gather_s(dense, f.Parallel(), 8, _LINKS, _E)["total"] == 0.0  # DP only: nothing to gather
    # a MoE: N 12e9, N_act 4.5e9, top-2 of 8 -> routed experts 7.5e9 / (1 - 1/4) = 10e9
    # parameters (W_x = 20e9 bytes), the rest 2e9 (W_d = 4e9 bytes)
    moe = f.Arch(12e9, 4.5e9, 8, 1024, 256, 2, experts_per_token=2, num_experts=8)
    one_node = rf.refit_gather_s(moe, f.Parallel(ep=4), 8, _LINKS, _E)
    assert one_node["ep"] == pytest.approx(20e9 * 3 / 4 / 400e9) and one_node["pp"] == one_node["tp"] == 0.0
    wide = rf.refit_gather_s(moe, f.Parallel(ep=16), 16, _LINKS, _E)  # EP 16 spans two nodes
    assert wide["ep"] == pytest.approx(20e9 * 15 / 16 / 100e9)
    staged = rf.refit_gather_s(moe, f.Parallel(ep=4, pp=2), 16, _LINKS, _E)  # each local expert crosses the stages
    assert staged["pp"] == pytest.approx((4e9 + 20e9 / 4) / 100e9)
    with pytest.raises(ValueError):
        rf.refit_gather_s(dense, f.Parallel(), 8, _LINKS, _E, "nccl")
    assert "b1c86a816c5e2b4ca41ece193624a38dc62e6fdf" in str(rf.REFIT_GATHER_SOURCES)


def _layout_scenario(**pipe):
    return _scenario("colocated_ipc", train_tp=2, train_pp=2, **pipe)


@pytest.mark.parametrize(
    "export, expected",
    [
        # qwen2.5-1.5b: W = 1.54e9 x 2 bytes; TP2 PP2 on one node of 4 (NVLink 450 GB/s): the TP
        # all-gather W/2 / 450e9, the PP broadcast the TP shard W/2 (megatron_bridge) or W
        ("megatron_bridge", 3.08e9 / 2 / 450e9 + 3.08e9 / 2 / 450e9),
        ("gather_params", 3.08e9 / 2 / 450e9 + 3.08e9 / 450e9),
    ],
)
def test_the_gather_is_derived_and_charged_inside_the_sync(export, expected):
    s = _layout_scenario(refit_export=export)
    p = s.pipelines[0]
    assert p.refit_export == export and p.costs.refit_gather_s == pytest.approx(expected)
    c = p.costs
    closed = rf.colocated_ipc_refit_s(
        p.model.weight_bytes,
        c.bucket_bytes,
        GPU_PRESETS["h100_sxm"].hbm_bytes_per_s,
        c.hbm_efficiency,
        c.refit_tensor_overhead_s,
        c.refit_group_overhead_s,
        c.refit_setup_s + c.refit_complete_s,
        gather_s=c.refit_gather_s,
    )
    syncs = _sync_s(Simulation(s).run().records)
    assert syncs and all(t == pytest.approx(closed, rel=1e-9) for t in syncs)


def test_the_gather_is_the_colocated_paths_only_and_explicit_wins():
    assert _scenario("cpu_cache", train_tp=2, train_pp=2).pipelines[0].costs.refit_gather_s == 0.0
    kept = _layout_scenario(costs={"refit_gather_s": 2.5}).pipelines[0].costs.refit_gather_s
    assert kept == 2.5


def test_a_bad_refit_export_is_one_line_naming_the_field():
    with pytest.raises(ScenarioError) as e:
        _layout_scenario(refit_export="nccl")
    msg = str(e.value)
    assert "pipelines[0].refit_export: must be one of megatron_bridge, gather_params, got 'nccl'" in msg
    assert "\n" not in msg
