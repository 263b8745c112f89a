"""The cost model's decode: the capped length distribution, a mixture of experts' weight
read by expert coverage, and the per-step timing it derives. References are independent:
numeric integration of the log-normal, the models' config.json sizes, hand sums."""

from __future__ import annotations

import glob
import math
import os

import numpy as np
import pytest

from simulators.costmodel import formulas as f
from simulators.costmodel.hardware import GPU_PRESETS
from simulators.costmodel.models import MODEL_PRESETS
from simulators.scenario.loader import load_scenario, scenario_from_mapping

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _capped_mean_numeric(median, sigma, cap):
    """E[min(L, cap)] for L = median·e^(σZ), by the trapezoid rule over Z in [-10, 10]."""
    z = np.linspace(-10, 10, 400001)
    density = np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    return float(np.trapezoid(np.minimum(median * np.exp(sigma * z), cap) * density, z))


@pytest.mark.parametrize(
    "median, sigma, cap", [(622, 0.7, 3936), (3936, 0.7, 3936), (586, 0.7, 16224), (192, 1.5, 1024), (100, 0.0, 1000)]
)
def test_capped_mean_is_the_mean_of_the_capped_draws(median, sigma, cap):
    assert f.mean_decode_tokens(median, sigma, cap) == pytest.approx(_capped_mean_numeric(median, sigma, cap), rel=1e-6)


def test_median_for_mean_inverts_the_capped_mean():
    m = f.median_for_mean(3091, 0.7, 3936)
    assert _capped_mean_numeric(m, 0.7, 3936) == pytest.approx(3091, rel=1e-6)
    assert m > 3091 / math.exp(0.245)  # the cap bites: a larger median than the uncapped solution
    with pytest.raises(ValueError):
        f.median_for_mean(4000, 0.7, 3936)


#: published mean generated tokens (v0.3 post: "avg generated tokens"; performance summary: mean
#: sequence length less the scenarios' 160-token prompt)
PUBLISHED_MEAN_DECODE = {
    "llama3.1_8b_grpo_v03_breakdown": 795,
    "llama3.1_70b_grpo_v03_breakdown": 398,
    "qwen3_32b_grpo_v03_breakdown": 3283,
    "qwen3_30b_a3b_grpo_v03_breakdown": 3251,
    "llama3.3_70b_16k_grpo_v03_breakdown": 749,
    "llama3.1_8b_grpo_onpolicy": 1019 - 160,
    "qwen3_32b_grpo_onpolicy": 3251 - 160,
    "qwen3_30b_a3b_grpo_onpolicy": 3154 - 160,
    "qwen3_30b_a3b_grpo_onpolicy_v06": 3203 - 160,
    "qwen3_235b_a22b_grpo_onpolicy": 5698 - 160,
    "qwen3_235b_a22b_grpo_onpolicy_256gpu_v06": 5713 - 160,
}


def test_published_scenarios_draw_the_published_mean_length():
    """Each published scenario's capped log-normal averages the published mean, or where that
    needs a median above the cap (refused by validation) sits at the cap, at most 3 % under."""
    paths = sorted(glob.glob(os.path.join(ROOT, "examples", "published", "*.yaml")))
    assert {os.path.basename(p)[:-5] for p in paths} == set(PUBLISHED_MEAN_DECODE)
    for path in paths:
        w = load_scenario(path).pipelines[0].workload
        drawn = _capped_mean_numeric(w.decode_tokens_median, w.decode_tokens_sigma, w.decode_tokens_max)
        published = PUBLISHED_MEAN_DECODE[os.path.basename(path)[:-5]]
        if w.decode_tokens_median < w.decode_tokens_max:
            assert abs(drawn - published) <= 1.0, path
        else:
            assert 0.97 * published <= drawn < published, path


@pytest.mark.parametrize(
    "preset, layers, experts, hidden, moe_ffn",
    [
        ("qwen3-30b-a3b", 48, 128, 2048, 768),  # Qwen/Qwen3-30B-A3B config.json
        ("qwen3-235b-a22b", 94, 128, 4096, 1536),  # Qwen/Qwen3-235B-A22B config.json
    ],
)
def test_routed_expert_parameters_match_the_config(preset, layers, experts, hidden, moe_ffn):
    m = MODEL_PRESETS[preset]
    a = f.Arch(
        m.params,
        m.active_params,
        m.layers,
        m.hidden_size,
        m.num_kv_heads * m.head_dim,
        2,
        m.experts_per_token,
        m.num_experts,
    )
    gate_up_down = layers * experts * 3 * hidden * moe_ffn
    assert f.routed_expert_params(a) == pytest.approx(gate_up_down, rel=0.02)
    assert f.expected_experts_read(a, 1) == pytest.approx(8 / 128)
    assert f.expected_experts_read(a, 256) > 0.9999  # a rollout batch reads every expert


def _pipe(model, workload=None, tp=2):
    data = {
        "name": "s",
        "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "h100_sxm"},
        "pipelines": [
            {
                "name": "p",
                "type": "nemo_async",
                "train_gpus": [0],
                "infer_gpus": list(range(8)),
                "infer_tp": tp,
                "model": model,
                "workload": workload or {},
            }
        ],
    }
    return scenario_from_mapping(data, "t.yaml").pipelines[0]


def test_a_derived_moe_decode_reads_its_experts_by_coverage():
    p = _pipe({"preset": "qwen3-30b-a3b"})
    assert p.workload.decode_timing == "per_step" and p.model.num_experts == 128
    expert_bytes = 48 * 128 * 3 * 2048 * 768 * 2
    by_hand = expert_bytes / (2 * GPU_PRESETS["h100_sxm"].hbm_bytes_per_s * 0.8)
    assert p.workload.decode_expert_read_s == pytest.approx(by_hand, rel=0.02)
    fixed = p.workload.batching_half_point / p.workload.tokens_per_s_per_rank
    assert p.workload.decode_expert_read_s < fixed  # part of the full-coverage step


def test_a_dense_model_reads_no_experts_and_a_hand_set_curve_keeps_at_start():
    dense = _pipe({"preset": "qwen2.5-7b"}).workload
    assert dense.decode_timing == "per_step" and dense.decode_expert_read_s == 0.0
    hand = _pipe({"preset": "qwen3-30b-a3b"}, {"tokens_per_s_per_rank": 5000.0}).workload
    assert hand.decode_timing == "at_start" and hand.decode_expert_read_s == 0.0


def test_each_decode_step_pays_the_engines_host_work():
    """decode_step_overhead_s (4 ms by default, vllm-project/vllm#6854) is part of the step's
    fixed time: a/T grows by exactly it, the per-sequence time not at all."""
    arch = f.Arch(7e9, 7e9, 28, 3584, 512, 2)
    g = GPU_PRESETS["h100_sxm"]
    eff = dict(
        train_mfu=0.4,
        decode_flops_efficiency=0.5,
        hbm_efficiency=0.8,
        allreduce_latency_s=0.0,
        max_num_seqs=256,
        wake_fixed_s=0.0,
        sleep_fixed_s=0.0,
    )
    bare = f.decode_curve(arch, 1, 1000.0, g.bf16_flops, g.hbm_bytes_per_s, g.nvlink_bytes_per_s, f.Efficiency(**eff))
    host = f.decode_curve(
        arch,
        1,
        1000.0,
        g.bf16_flops,
        g.hbm_bytes_per_s,
        g.nvlink_bytes_per_s,
        f.Efficiency(**eff, decode_step_overhead_s=0.004),
    )
    assert host["tokens_per_s_per_rank"] == bare["tokens_per_s_per_rank"]
    a_bare = 7e9 * 2 / (g.hbm_bytes_per_s * 0.8)  # the weights read once
    assert bare["batching_half_point"] / bare["tokens_per_s_per_rank"] == pytest.approx(a_bare)
    assert host["batching_half_point"] / host["tokens_per_s_per_rank"] == pytest.approx(a_bare + 0.004)
    derived = _pipe({"preset": "qwen2.5-7b"}, tp=1).workload
    none = (
        scenario_from_mapping(
            {
                "name": "s",
                "costs": {"decode_step_overhead_s": 0.0},
                "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "h100_sxm"},
                "pipelines": [
                    {
                        "name": "p",
                        "type": "nemo_async",
                        "train_gpus": [0],
                        "infer_gpus": list(range(8)),
                        "model": {"preset": "qwen2.5-7b"},
                    }
                ],
            },
            "t.yaml",
        )
        .pipelines[0]
        .workload
    )
    gap = (
        derived.batching_half_point / derived.tokens_per_s_per_rank
        - none.batching_half_point / none.tokens_per_s_per_rank
    )
    assert gap == pytest.approx(0.004)
