"""Training-pass terms read from the NeMo RL recipes: full activation recomputation and the
expert-parallel group's link. Every reference below is worked out by hand from the
formula's definition (docs/cost-model.md), not by calling the code under test."""

from __future__ import annotations

import pytest

from simulators.costmodel import formulas as f
from simulators.scenario.loader import ScenarioError, scenario_from_mapping

F, NVL, NIC = 1e15, 400e9, 25e9
EFF = f.Efficiency(
    train_mfu=0.5,
    decode_flops_efficiency=0.5,
    hbm_efficiency=0.8,
    allreduce_latency_s=1e-5,
    max_num_seqs=256,
    wake_fixed_s=0.5,
    sleep_fixed_s=0.2,
    moe_train_mfu=0.25,
)
DENSE = f.Arch(params=1e9, active_params=1e9, layers=10, hidden_size=1000, kv_dim=100, bytes_per_param=2)
MOE = f.Arch(
    params=8e9,
    active_params=1e9,
    layers=10,
    hidden_size=1000,
    kv_dim=100,
    bytes_per_param=2,
    experts_per_token=2,
    num_experts=16,
)
LINKS = f.Links(NVL, NIC, 8)  # 8 GPUs a node: NVLink inside, 25 GB/s a GPU across


def test_full_recompute_adds_one_forward_of_work_and_of_collectives():
    """16 sequences of 1000 tokens on 8 GPUs, TP2: 4 matmul passes instead of 3, and 6 TP
    all-reduces a layer instead of 4 (the recomputed forward's 2 again); the forward-only
    log-prob pass ignores the flag."""
    plain = f.train_pass_s(DENSE, f.Parallel(tp=2), 16, 1000, 8, F, LINKS, EFF)
    recomputed = f.train_pass_s(DENSE, f.Parallel(tp=2, recompute=True), 16, 1000, 8, F, LINKS, EFF)
    # compute: 2 FLOP x 4 passes x 16 seqs x (1e9 x 1000 + 10 x 1000 x 1000^2) / (8 GPUs x 1e15 x 0.5)
    assert recomputed["compute"] == pytest.approx(2 * 4 * 16 * (1e12 + 1e10) / (8 * 1e15 * 0.5))
    assert plain["compute"] == pytest.approx(2 * 3 * 16 * (1e12 + 1e10) / (8 * 1e15 * 0.5))
    # TP: DP = 4, so a TP group holds 4000 tokens; each all-reduce moves 4000 x 1000 x 2 B x 2(2-1)/2 per GPU
    one_allreduce_layer = 10 * 4000 * 1000 * 2 * 1.0 / NVL
    assert recomputed["tp_comm"] == pytest.approx(6 * one_allreduce_layer)
    assert plain["tp_comm"] == pytest.approx(4 * one_allreduce_layer)
    fwd = f.train_pass_s(DENSE, f.Parallel(tp=2, recompute=True), 16, 1000, 8, F, LINKS, EFF, backward=False)
    assert fwd == f.train_pass_s(DENSE, f.Parallel(tp=2), 16, 1000, 8, F, LINKS, EFF, backward=False)


def test_the_expert_parallel_group_is_ep_consecutive_gpus_inside_a_node():
    """TP2 EP8 on 16 GPUs (two nodes): with expert TP 1 the EP group is 8 consecutive GPUs,
    one node, so its all-to-alls go over NVLink, not the NICs (tp x ep = 16 would span both).
    EP16 spans both nodes: each peer's bytes take that peer's link."""
    out = f.train_pass_s(MOE, f.Parallel(tp=2, ep=8), 16, 1000, 16, F, LINKS, EFF)
    # DP = 8: 2000 tokens a TP group, 1000 a GPU after sequence parallelism; 4 all-to-alls a layer
    # of k = 2 copies x 1000 x 2 B each, 7/8 of them leaving the GPU
    assert out["ep_comm"] == pytest.approx(4 * 10 * 1000 * 2 * 1000 * 2 * 7 / 8 / NVL)
    recomputed = f.train_pass_s(MOE, f.Parallel(tp=2, ep=8, recompute=True), 16, 1000, 16, F, LINKS, EFF)
    assert recomputed["ep_comm"] == pytest.approx(out["ep_comm"] * 6 / 4)
    wide = f.train_pass_s(MOE, f.Parallel(ep=16), 16, 1000, 16, F, LINKS, EFF)  # 16 GPUs: across the NICs
    # DP 16: 1000 tokens a GPU; of its copies 7/16 go to the 7 peers in its node (NVLink) and
    # 8/16 to the 8 in the other node (the NIC), both at once: the NIC's share is the time
    copies = 4 * 10 * 1000 * 2 * 1000 * 2
    assert copies * 7 / 16 / NVL < copies * 8 / 16 / NIC
    assert wide["ep_comm"] == pytest.approx(copies * 8 / 16 / NIC)
    # the NVLink share decides when the NICs are fast enough
    fast = f.train_pass_s(MOE, f.Parallel(ep=16), 16, 1000, 16, F, f.Links(NVL, 1e12, 8), EFF)
    assert fast["ep_comm"] == pytest.approx(copies * 7 / 16 / NVL)


def _scenario(extra):
    pipe = {
        "name": "p",
        "type": "roll_sync",
        "train_gpus": list(range(8)),
        "infer_gpus": list(range(8)),
        "infer_tp": 1,
        "model": {"preset": "qwen2.5-7b"},
        "workload": {"prompts_per_step": 8},
        **extra,
    }
    return scenario_from_mapping(
        {"name": "s", "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "h100_sxm"}, "pipelines": [pipe]}, "t.yaml"
    )


def test_train_recompute_scales_a_data_parallel_training_stage_by_four_thirds():
    """DP only, one optimizer step: only the compute and the gradient all-reduce remain, and
    only the compute grows (by 4/3); the log-prob stage is unchanged."""
    plain = _scenario({}).pipelines[0].costs
    recomputed = _scenario({"train_recompute": True}).pipelines[0]
    assert recomputed.train_recompute is True
    assert recomputed.costs.old_log_probs_s_per_trajectory == plain.old_log_probs_s_per_trajectory
    n = recomputed.workload.prompts_per_step * recomputed.workload.generations_per_prompt
    # one ring all-reduce of the 7.62e9 fp32 gradients among 8 GPUs over NVLink (450 GB/s, the h100 preset)
    grad = 2 * 7 / 8 * 7.62e9 * 4 / 450e9
    gpus_over_n = 8 / n  # the simulator charges x * n / G
    compute_plain = plain.train_s_per_trajectory - grad * gpus_over_n
    compute_recomputed = recomputed.costs.train_s_per_trajectory - grad * gpus_over_n
    assert compute_recomputed == pytest.approx(compute_plain * 4 / 3, rel=1e-9)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_train_recompute_is_one_line_naming_the_field(value):
    with pytest.raises(ScenarioError) as e:
        _scenario({"train_recompute": value})
    assert "pipelines[0].train_recompute" in str(e.value) and "\n" not in str(e.value)
