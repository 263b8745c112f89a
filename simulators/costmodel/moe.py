"""A mixture of experts' decode, beyond a dense model's: which experts a step reads, and how
slowly the routed experts' matmuls run.

Two properties of every mixture of experts, each from its source, neither fitted to an RL run:

* **The weight read** (:func:`routed_expert_params`, :func:`expected_experts_read`): a decode
  step reads only the experts its tokens route to (vLLM's fused-MoE kernel loads an expert's
  weights only for a block of tokens routed to it: :data:`FUSED_MOE_SOURCE`).
* **The routed experts' matmul rate** (:data:`MOE_DECODE_FLOPS_EFFICIENCY`,
  :func:`expert_matmul_s_per_seq`): at a decode step's batch each expert gets a few tokens
  (c·k/E: 16 of 256 sequences for k/E = 8/128), and the fused-MoE kernel runs them as many
  small, padded blocks plus the routing (top-k, the token sort, the weighted combine), so the
  active experts' FLOPs per sequence cost far more time than a dense layer's. Measured, not
  derived: vLLM's inter-token latency of Qwen3-30B-A3B on H100s at batch sizes from 64 to
  1,019 (:data:`MOE_DECODE_SOURCE`, the ML.ENERGY leaderboard's ``lm-arena-chat`` task) grows
  about three times as fast with the batch as the roofline of its active parameters at the
  dense decode efficiency says, while the same method on the dense Qwen3-32B of that table
  recovers the dense ``decode_flops_efficiency`` (0.50). ``benchmarks/moe_decode_fit.py``
  redoes the fit (least squares on the log of the latency, the batches from 64 up, where the
  per-sequence term is most of the step) and checks it on Qwen3-235B-A22B of the same table.
"""

from __future__ import annotations

from typing import Any

#: share of peak FLOP/s the routed experts' matmuls of a decode step reach (the module doc):
#: the least-squares fit on :data:`MOE_DECODE_SOURCE`'s Qwen3-30B-A3B on two H100s
#: (``benchmarks/moe_decode_fit.py`` prints 0.040; Qwen3-235B-A22B on eight gives 0.032)
MOE_DECODE_FLOPS_EFFICIENCY = 0.04

#: where the routed experts' decode rate is read from: per configuration (GPU, GPU count,
#: max_num_seqs) the measured median inter-token latency, mean batch size and mean output
#: length of vLLM serving the model in BF16
MOE_DECODE_SOURCE = (
    "ml-energy/leaderboard",
    "public/data/models/Qwen__Qwen3-30B-A3B-Instruct-2507__lm-arena-chat.json, "
    "Qwen__Qwen3-235B-A22B-Instruct-2507__lm-arena-chat.json, Qwen__Qwen3-32B__lm-arena-chat.json "
    "(configurations with gpu_model H100: median_itl_ms, avg_batch_size, avg_output_len)",
    "0cd52dab897c5d91a45f4d413038f3b8b4251b0f",
)

#: where a decode step's expert read is read from: ``moe_align_block_size`` pads each
#: expert's token count to the block size (0 tokens -> 0 blocks) and ``fused_moe_kernel`` runs
#: one block per entry of its ``expert_ids``, loading that expert's weights
FUSED_MOE_SOURCE = (
    "vllm-project/vllm",
    "vllm/model_executor/layers/fused_moe/moe_align_block_size.py, fused_moe.py",
    "05be99241939c8849bafef74932aed13f956c82f",
)


def _is_moe(a: Any) -> bool:
    return a.experts_per_token > 0 and a.num_experts > a.experts_per_token


def routed_expert_params(a: Any) -> float:
    """Parameters of the routed experts, from N, N_act, k and E: a token reads k of the E
    experts of each MoE layer, so N − N_act = P_exp·(1 − k/E). 0 for a dense model or
    where E is not given (then every step reads all the weights, the upper bound)."""
    if not _is_moe(a):
        return 0.0
    return (a.params - a.active_params) / (1.0 - a.experts_per_token / a.num_experts)


def routed_active_params(a: Any) -> float:
    """The routed experts' parameters a token's forward multiplies by: k/E of them."""
    return routed_expert_params(a) * a.experts_per_token / a.num_experts if _is_moe(a) else 0.0


def expected_experts_read(a: Any, c: int) -> float:
    """Share of a MoE layer's routed experts that at least one of ``c`` tokens routes to,
    each token picking k of E uniformly: 1 − (1 − k/E)^c (the occupancy expectation; vLLM's
    fused-MoE kernel launches blocks only for experts with tokens, see
    :data:`FUSED_MOE_SOURCE`, so only those experts' weights are read)."""
    return 1.0 - (1.0 - a.experts_per_token / a.num_experts) ** c


def expert_matmul_s_per_seq(a: Any, tp: int, flops: float, dense_efficiency: float, moe_efficiency: float) -> float:
    """Seconds one sequence adds to a decode step of a ``tp``-GPU rank for its routed
    experts' matmuls *beyond* what the dense term (all active parameters at
    ``dense_efficiency``) already charges: 2·N_exp_act/(tp·F)·(1/moe_eff − 1/dense_eff).
    0 for a dense model, or where E is not given."""
    active = routed_active_params(a)
    if not active:
        return 0.0
    return 2.0 * active / (tp * flops) * (1.0 / moe_efficiency - 1.0 / dense_efficiency)
