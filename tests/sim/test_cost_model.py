"""The cost model: presets, formulas, and explicit numbers winning over derived ones."""

from __future__ import annotations

import math

import pytest

from simulators.costmodel import formulas as f
from simulators.costmodel import refit_formulas as rf
from simulators.costmodel.hardware import GPU_PRESETS
from simulators.costmodel.models import MODEL_PRESETS
from simulators.scenario.loader import ScenarioError, scenario_from_mapping
from simulators.scenario.spec import CostSpec, WorkloadSpec

EFF = f.Efficiency(
    train_mfu=0.4,
    decode_flops_efficiency=0.5,
    hbm_efficiency=0.8,
    allreduce_latency_s=1e-5,
    max_num_seqs=256,
    wake_fixed_s=0.5,
    sleep_fixed_s=0.2,
)
SEVEN_B = f.Arch(params=7e9, active_params=7e9, layers=28, hidden_size=3584, kv_dim=4 * 128, bytes_per_param=2)


def _scenario(pipe_extra=None, costs=None, gpu="h100_sxm", model=None, workload=None):
    pipe = {
        "name": "p",
        "type": "nemo_async",
        "train_gpus": [0],
        "infer_gpus": list(range(8)),
        "infer_tp": 2,
        "model": model or {"preset": "qwen2.5-7b"},
        "workload": workload or {},
        **(pipe_extra or {}),
    }
    data = {
        "name": "s",
        "cluster": {"nodes": 1, "gpus_per_node": 8, **({"gpu": gpu} if gpu else {})},
        "pipelines": [pipe],
    }
    if costs:
        data["costs"] = costs
    return scenario_from_mapping(data, "t.yaml")


def test_decode_curve_is_the_step_time_sum_it_claims():
    """c / t(c) from the step time written out here equals T·c/(c+h) at every concurrency."""
    gpu = GPU_PRESETS["h100_sxm"]
    tp, ctx = 2, 1000.0
    curve = f.decode_curve(SEVEN_B, tp, ctx, gpu.bf16_flops, gpu.hbm_bytes_per_s, gpu.nvlink_bytes_per_s, EFF)
    hbm = gpu.hbm_bytes_per_s * 0.8
    for c in (1, 8, 64, 512):
        weights_read = 7e9 * 2 / (tp * hbm)
        matmuls = c * 2 * 7e9 / (tp * gpu.bf16_flops * 0.5)
        kv_read = c * (2 * 28 * 512 * 2) * ctx / (tp * hbm)
        allreduce = 4 * 28 * 1e-5 + c * 4 * 28 * 3584 * 2 * 0.5 / gpu.nvlink_bytes_per_s
        step = weights_read + matmuls + kv_read + allreduce
        model = curve["tokens_per_s_per_rank"] * c / (c + curve["batching_half_point"])
        assert math.isclose(c / step, model, rel_tol=1e-9)


def test_training_flops_follow_six_n_t_plus_attention():
    gpu = GPU_PRESETS["a100_80gb"]
    t = f.train_s_per_trajectory(SEVEN_B, 2000, gpu.bf16_flops, EFF)
    expected = (6 * 7e9 * 2000 + 6 * 28 * 3584 * 2000**2) / (312e12 * 0.4)
    assert math.isclose(t, expected)
    assert math.isclose(f.log_probs_s_per_trajectory(SEVEN_B, 2000, gpu.bf16_flops, EFF) * 3, t)


def test_a_mixture_of_experts_trains_on_its_active_parameters():
    moe = MODEL_PRESETS["qwen3-30b-a3b"]
    dense = MODEL_PRESETS["qwen2.5-32b"]
    s_moe = _scenario(model={"preset": moe.name}, costs={"moe_train_mfu": 0.35})  # the same MFU as the dense one
    s_dense = _scenario(model={"preset": dense.name}, pipe_extra={"infer_tp": 2})
    assert s_moe.pipelines[0].costs.train_s_per_trajectory < s_dense.pipelines[0].costs.train_s_per_trajectory / 5


def test_presets_derive_per_pipeline_costs_and_cluster_links():
    s = _scenario()
    p = s.pipelines[0]
    assert s.cluster.vram_bytes == GPU_PRESETS["h100_sxm"].hbm_bytes
    assert s.cluster.intra_node_bytes_per_s == GPU_PRESETS["h100_sxm"].nvlink_bytes_per_s
    assert p.model.params == MODEL_PRESETS["qwen2.5-7b"].params and p.model.layers == 28
    assert p.costs is not None and p.costs.train_s_per_trajectory != CostSpec.train_s_per_trajectory
    assert p.workload.tokens_per_s_per_rank != WorkloadSpec.tokens_per_s_per_rank


def test_more_tensor_parallelism_decodes_faster_per_rank():
    rates = [_scenario(pipe_extra={"infer_tp": tp}).pipelines[0].workload.tokens_per_s_per_rank for tp in (1, 2, 4)]
    assert rates[0] < rates[1] < rates[2]


def test_explicit_numbers_win_over_derived_ones():
    derived = _scenario().pipelines[0]
    s = _scenario(
        costs={"train_s_per_trajectory": 9.0},
        workload={"tokens_per_s_per_rank": 1234.0},
        pipe_extra={"costs": {"wake_s": 3.0}},
    )
    p = s.pipelines[0]
    assert p.costs.train_s_per_trajectory == 9.0  # the scenario's costs section
    assert p.costs.wake_s == 3.0  # the pipeline's own
    assert p.workload.tokens_per_s_per_rank == 1234.0
    assert p.costs.old_log_probs_s_per_trajectory == derived.costs.old_log_probs_s_per_trajectory


def test_without_a_gpu_preset_nothing_is_derived():
    s = _scenario(gpu=None)
    p = s.pipelines[0]
    assert p.costs is None and p.workload == WorkloadSpec()
    assert p.model.layers == 28  # the model preset still fills the architecture


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gpu": "h999"}, "cluster.gpu: unknown GPU preset 'h999'"),
        ({"model": {"preset": "gpt-9"}}, "pipelines[0].model.preset: unknown model preset 'gpt-9'"),
        (
            {"model": {"preset": "llama3.1-70b"}, "pipe_extra": {"infer_tp": 1}, "gpu": "l40s"},
            "pipelines[0].model: 7.06e+10 parameters and one trajectory's KV cache",
        ),
        ({"costs": {"train_mfu": 1.5}}, "costs.train_mfu: must be in (0, 1]"),
    ],
)
def test_bad_cost_model_input_is_one_line_naming_the_field(kwargs, message):
    with pytest.raises(ScenarioError) as e:
        _scenario(**kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_refit_closed_form_is_what_the_simulator_charges_per_link():
    """A 7B's sync from the cache: the simulated sync_start -> sync_end equals refit_formulas.refit_s
    over NVLink (H100) and over PCIe (L40S, no NVLink), and a bigger bucket saves exactly
    the per-bucket overheads it no longer pays."""
    from simulators.runtime.simulation import Simulation
    from simulators.scenario.yaml_dialect import strict_safe_load

    path = "examples/scenarios/costmodel_7b_and_1p5b_h100.yaml"
    for gpu in ("h100_sxm", "l40s"):
        for bucket in (256 << 20, 1 << 30):
            data = strict_safe_load(open(path, encoding="utf-8").read())
            data["cluster"]["gpu"] = gpu
            data["costs"] = {"bucket_bytes": bucket, "refit_group_overhead_s": 0.004, "refit_tensor_overhead_s": 0.001}
            data["horizon_s"] = 40
            s = scenario_from_mapping(data, path)
            start = end = None
            for r in Simulation(s).run().records:
                if (
                    r["kind"] == "sync_start"
                    and r["pipeline_id"] == "p7b"
                    and r["broadcast_dp_ranks"]
                    and start is None
                ):
                    start = r
                elif start is not None and end is None and r["kind"] == "sync_end" and r["pipeline_id"] == "p7b":
                    end = r
            c, cl = s.pipelines[0].costs, s.cluster
            expected = rf.refit_s(
                s.pipelines[0].model.weight_bytes,
                bucket,
                cl.pcie_bytes_per_s,
                cl.intra_node_bytes_per_s,
                c.receiver_load_bytes_per_s,
                0.001,
                0.004,
                c.nccl_group_create_s + c.nccl_group_destroy_s,
            )
            assert end["t"] - start["t"] == pytest.approx(expected, rel=1e-6), (gpu, bucket)


def test_published_scenarios_round_trip_through_the_dumped_scenario_yaml():
    """scenario.yaml of a run folder reloads to the same scenario: the training layout and
    the derived costs survive (the dump names each non-default layout field)."""
    import glob

    from simulators.scenario.loader import load_scenario
    from simulators.scenario.dump import scenario_to_mapping

    for path in sorted(glob.glob("examples/published/*.yaml")):
        s = load_scenario(path)
        assert scenario_from_mapping(scenario_to_mapping(s), path) == s, path


def test_a_reference_policy_doubles_the_log_prob_stage_and_nothing_else():
    one = _scenario(pipe_extra={"infer_tp": 2}).pipelines[0].costs
    two = _scenario(pipe_extra={"infer_tp": 2, "log_prob_passes": 2}).pipelines[0].costs
    assert two.old_log_probs_s_per_trajectory == pytest.approx(2 * one.old_log_probs_s_per_trajectory)
    assert two.train_s_per_trajectory == one.train_s_per_trajectory


def test_log_probs_taken_from_the_rollout_cost_no_pass():
    one = _scenario(pipe_extra={"infer_tp": 2}).pipelines[0].costs
    none = _scenario(pipe_extra={"infer_tp": 2, "log_prob_passes": 0}).pipelines[0].costs
    assert none.old_log_probs_s_per_trajectory == 0.0 < one.old_log_probs_s_per_trajectory
    assert none.train_s_per_trajectory == one.train_s_per_trajectory


def test_the_mean_decode_length_with_a_share_at_the_cap():
    # sigma 0: 90 % of the answers at the median 100, 10 % at the cap 1000 -> 190
    assert f.mean_decode_tokens(100, 0.0, 1000, 0.1) == pytest.approx(190.0)
    # median 100, sigma 1, cap 1000, half at the cap: z_s = 0 < ln(10), so the lower half
    # averages 100 e^0.5 Phi(-1) = 164.8721 x 0.1586553 = 26.1578, the upper half 1000 x 0.5
    assert f.mean_decode_tokens(100, 1.0, 1000, 0.5) == pytest.approx(526.1578, rel=1e-6)
    assert f.mean_decode_tokens(586, 0.7, 16224, 0.0) == f.mean_decode_tokens(586, 0.7, 16224)
    m = f.median_for_mean(749, 0.7, 16224, 0.001)
    assert f.mean_decode_tokens(m, 0.7, 16224, 0.001) == pytest.approx(749, rel=1e-9)
    with pytest.raises(ValueError):
        f.median_for_mean(10, 0.7, 16224, 0.001)  # below what the share at the cap alone averages
