"""A mixture of experts' routed-expert decode matmuls (simulators/costmodel/moe.py): the
default efficiency is the fit on the published vLLM latencies benchmarks/moe_decode_fit.py
holds, the same fit recovers the dense default on a dense model, and the term touches only a
mixture of experts' per-sequence cost."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulators.costmodel import formulas as f
from simulators.costmodel.hardware import GPU_PRESETS
from simulators.costmodel.models import MODEL_PRESETS
from simulators.scenario.spec import CostSpec
from tests.sim.benchmark_module import load_benchmark


def _bench():
    return load_benchmark("moe_decode_fit")


def test_default_is_the_fit_on_qwen3_30b_a3b_and_the_method_recovers_the_dense_default():
    b = _bench()
    assert b.fit("qwen3-30b-a3b", "moe_decode_flops_efficiency") == pytest.approx(
        CostSpec.moe_decode_flops_efficiency, abs=0.001
    )
    # an independent check of the procedure: on a dense model it lands on the dense default
    assert b.fit("qwen3-32b", "decode_flops_efficiency") == pytest.approx(CostSpec.decode_flops_efficiency, abs=0.02)
    # and the MoE default keeps the second model of the table within 15 % at every batch
    e = b._efficiency()
    for gpus, batch, out, ms in b.MEASURED["qwen3-235b-a22b"]:
        assert b.step_ms("qwen3-235b-a22b", gpus, batch, out, e) / ms == pytest.approx(1.0, abs=0.15)


def _arch(name):
    m = MODEL_PRESETS[name]
    kv = m.num_kv_heads * m.head_dim
    return f.Arch(m.params, m.active_params, m.layers, m.hidden_size, kv, 2, m.experts_per_token, m.num_experts)


def _per_seq(name, moe_eff):
    g = GPU_PRESETS["h100_sxm"]
    e = f.Efficiency(0.35, 0.5, 0.8, 10e-6, 256, 0.0, 0.0, moe_decode_flops_efficiency=moe_eff)
    curve = f.decode_curve(_arch(name), 4, 1000.0, g.bf16_flops, g.hbm_bytes_per_s, g.nvlink_bytes_per_s, e)
    return 1.0 / curve["tokens_per_s_per_rank"]


def test_the_term_charges_the_routed_active_experts_only():
    a, flops = _arch("qwen3-30b-a3b"), GPU_PRESETS["h100_sxm"].bf16_flops
    routed = f.routed_expert_params(a) * 8 / 128
    assert 0 < routed < a.active_params  # attention and the embeddings are not routed
    extra = _per_seq("qwen3-30b-a3b", 0.04) - _per_seq("qwen3-30b-a3b", 0.5)
    assert extra == pytest.approx(2 * routed / (4 * flops) * (1 / 0.04 - 1 / 0.5), rel=1e-9)
    assert _per_seq("qwen3-32b", 0.04) == _per_seq("qwen3-32b", 0.5)  # a dense model is untouched
    no_e = replace(a, num_experts=0)  # E not given: no routed share known, nothing added
    assert f.expert_matmul_s_per_seq(no_e, 4, flops, 0.5, 0.04) == 0.0
