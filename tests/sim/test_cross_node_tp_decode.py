"""A tensor-parallel decode group wider than a node: each of its all-reduces pays what the
network adds to NCCL's latency (vLLM's custom all-reduce stays inside a node). References
are hand sums of NCCL's latency table (NVIDIA/nccl src/graph/tuning.cc at
01afd20a77b5804e0ecf1042509dd9d20ebf9e93: tree/LL, base 4.4 µs, 0.52 µs a hop over NVLink,
5.0 µs over the network, in-node hops x1.8 once the group spans nodes) and vLLM's two
all-reduces a decoder layer."""

from __future__ import annotations

import pytest

from simulators.costmodel import formulas as f
from simulators.scenario.loader import scenario_from_mapping

# NCCL's tree/LL all-reduce latency, written out by hand (µs)
ONE_NODE_8 = 4.4 + 2 * (7 * 0.52)  # 8 ranks in one node: 11.68
TWO_NODES_16 = 4.4 + 2 * (7 * 0.52 * 1.8 + 1 * 5.0)  # 16 ranks, 8 a node: 27.504
FOUR_NODES_32 = 4.4 + 2 * (7 * 0.52 * 1.8 + 2 * 5.0)  # 32 ranks, 8 a node: log2(4) network hops


@pytest.mark.parametrize(
    "tp, per_node, extra_us",
    [(16, 8, TWO_NODES_16 - ONE_NODE_8), (32, 8, FOUR_NODES_32 - ONE_NODE_8), (8, 8, 0.0), (4, 8, 0.0), (16, 0, 0.0)],
)
def test_a_group_over_nodes_adds_the_networks_latency(tp, per_node, extra_us):
    assert f.cross_node_allreduce_latency_s(tp, per_node) == pytest.approx(extra_us * 1e-6, abs=1e-12)


def _qwen3_235b_tp16(nodes: int, per_node: int):
    data = {
        "name": "s",
        "cluster": {"nodes": nodes, "gpus_per_node": per_node, "gpu": "h100_sxm"},
        "pipelines": [
            {
                "name": "p",
                "type": "nemo_async",
                "train_gpus": [0],
                "infer_gpus": list(range(32)),  # two engines (the overlap rule needs two)
                "infer_tp": 16,
                "model": {"preset": "qwen3-235b-a22b"},
            }
        ],
    }
    return scenario_from_mapping(data, "t.yaml").pipelines[0].workload


def test_a_derived_decode_step_over_two_nodes_pays_it_on_two_allreduces_a_layer():
    """The decode step's fixed part (a = h / T) of a TP 16 engine on two 8-GPU nodes exceeds the
    same engine's inside one 16-GPU node by two all-reduces a layer (94 layers) of the extra
    latency; the per-sequence part is where the link differs, not the fixed part."""
    split, whole = _qwen3_235b_tp16(4, 8), _qwen3_235b_tp16(2, 16)
    fixed = lambda w: w.batching_half_point / w.tokens_per_s_per_rank  # noqa: E731
    assert fixed(split) - fixed(whole) == pytest.approx(2 * 94 * (TWO_NODES_16 - ONE_NODE_8) * 1e-6, rel=1e-9)
