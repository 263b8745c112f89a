"""FSDP2 training in the cost model (simulators/costmodel/fsdp2.py): its parts against a
hand computation of the bytes each collective moves, Ulysses sequence parallelism adding
its all-to-alls, bigger microbatches gathering less often, and a layout FSDP2 cannot take
refused in one line naming the field."""

from __future__ import annotations

import math

import pytest

from simulators.costmodel import formulas as f
from simulators.costmodel.fsdp2 import fsdp2_pass_s
from simulators.scenario.loader import ScenarioError, scenario_from_mapping

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
LINKS = f.Links(intra=450e9, inter=50e9, gpus_per_node=8)


def test_fsdp2_parts_are_the_bytes_each_collective_moves():
    n, T, G = 64, 2000, 8
    parts = fsdp2_pass_s(SEVEN_B, f.Parallel(backend="fsdp2", micro_batch=2), n, T, G, 989e12, LINKS, EFF)
    micro = 64 / (8 * 2)  # microbatches each GPU runs
    assert math.isclose(parts["compute"], 2 * 3 * n * (7e9 * T + 28 * 3584 * T * T) / (G * 989e12 * 0.4))
    assert math.isclose(parts["fsdp_gather"], micro * 2 * 7e9 * 2 * (7 / 8) / 450e9)  # forward + backward, bf16
    assert math.isclose(parts["fsdp_reduce"], micro * 7e9 * 4 * (7 / 8) / 450e9)  # fp32 gradients
    assert parts["sp_comm"] == 0
    fwd = fsdp2_pass_s(SEVEN_B, f.Parallel(backend="fsdp2", micro_batch=2), n, T, G, 989e12, LINKS, EFF, backward=False)
    assert math.isclose(fwd["fsdp_gather"], parts["fsdp_gather"] / 2) and fwd["fsdp_reduce"] == 0


def test_ulysses_adds_its_all_to_alls_and_halves_the_groups():
    n, T, G = 64, 2000, 8
    sp = fsdp2_pass_s(SEVEN_B, f.Parallel(backend="fsdp2", sp=2), n, T, G, 989e12, LINKS, EFF)
    tok_gpu = n * T / G
    per_layer = (2 * 3584 + 2 * 512) * 2 * tok_gpu * (1 / 2)
    assert math.isclose(sp["sp_comm"], 2 * 28 * per_layer / 450e9)  # forward once, backward once
    plain = fsdp2_pass_s(SEVEN_B, f.Parallel(backend="fsdp2"), n, T, G, 989e12, LINKS, EFF)
    assert math.isclose(sp["fsdp_gather"], 2 * plain["fsdp_gather"])  # 4 groups run twice the microbatches


def _pipe(**extra):
    p = {
        "name": "p",
        "type": "disaggregated",
        "train_gpus": list(range(4)),
        "infer_gpus": [4, 5, 6, 7],
        "model": {"preset": "qwen2.5-7b"},
        **extra,
    }
    return scenario_from_mapping(
        {"name": "s", "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "h100_sxm"}, "pipelines": [p]}, "t.yaml"
    ).pipelines[0]


def test_a_scenario_derives_fsdp2_costs_with_more_communication_than_megatron_dp():
    megatron, fsdp = _pipe().costs, _pipe(train_backend="fsdp2").costs
    assert fsdp.train_s_per_trajectory > megatron.train_s_per_trajectory  # per-microbatch gathers and reduces


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"train_backend": "deepspeed"}, "pipelines[0].train_backend: must be megatron or fsdp2"),
        ({"train_backend": "fsdp2", "train_tp": 2}, "pipelines[0].train_backend: fsdp2 shards over every training GPU"),
        ({"train_sp": 2}, "pipelines[0].train_sp: train_sp is fsdp2's Ulysses sequence parallelism"),
        (
            {"train_backend": "fsdp2", "train_sp": 3},
            "pipelines[0].train_sp: 4 training GPUs are not a multiple of train_sp 3",
        ),
    ],
)
def test_a_layout_fsdp2_cannot_take_is_one_line_naming_the_field(extra, message):
    with pytest.raises(ScenarioError) as e:
        _pipe(**extra)
    assert message in str(e.value) and "\n" not in str(e.value)
