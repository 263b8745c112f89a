"""Cost formulas, each written once. Units: seconds, bytes, FLOP, tokens.

Notation: N = parameters (N_act: active per token, = N for a dense model), L = layers,
d = hidden size, kv = KV heads x head dim, b = bytes per parameter (and per KV element),
T = tokens of one trajectory (prompt + decode), F = the GPU's dense peak FLOP/s, B = its
HBM bytes/s.

* Training, per trajectory on one GPU: (6·N_act·T + 6·L·d·T²) / (F · train_mfu). 6·N·T
  is the forward + backward matmul work (Kaplan et al. 2020, "Scaling Laws for Neural
  Language Models", §2.1); 6·L·d·T² the causal attention scores and context, forward and
  backward (2·L·d·T² forward: half of the full 4·L·d·T² because of the causal mask).
  MFU is the usual model-FLOPs utilization; the simulator divides by the training GPUs.
* Log-probs (forward only): (2·N_act·T + 2·L·d·T²) / (F · train_mfu).
* Decode, one step of a rank (a TP bundle of ``tp`` GPUs) serving ``c`` sequences — the
  roofline read as a sum (memory time plus compute time; NVIDIA's "Mastering LLM
  Techniques: Inference Optimization" and vLLM's own sizing notes reason the same way):
      t(c) = W/(tp·B·hbm_eff) + 4·L·α·[tp>1]
             + c · ( 2·N_act/(tp·F·decode_eff) + kv_bytes(ctx)/(tp·B·hbm_eff)
                     + 4·L·d·b·(tp-1)/tp / link )
  W = N·b is read once per step; each sequence adds its matmuls, its KV cache read
  (kv_bytes(ctx) = 2·L·kv·b·ctx at the mean context) and its share of the two TP
  all-reduces per layer (ring: 2(tp-1)/tp of the bytes each; α the per-all-reduce latency).
  So t(c) = a + β·c and the rank's throughput c/t(c) = (1/β)·c/(c + a/β): exactly the
  simulator's batching curve T·c/(c + h) with T = 1/β (``tokens_per_s_per_rank``) and
  h = a/β (``batching_half_point``).
* KV capacity: (tp·vram·kv_cache_fraction − W) / kv_bytes(T_mean), capped at the engine's
  ``max_num_seqs`` (vLLM's default 256): ``max_concurrent_per_rank``.
* Wake and sleep (level 1: weights to and from host RAM over PCIe): fixed + (W/tp)/pcie;
  level 2 drops the weights (the sync brings them), so only the fixed part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class Arch:
    params: float
    active_params: float
    layers: int
    hidden_size: int
    kv_dim: int          # KV heads x head dim
    bytes_per_param: int


@dataclass(frozen=True)
class Efficiency:
    train_mfu: float
    decode_flops_efficiency: float
    hbm_efficiency: float
    allreduce_latency_s: float
    max_num_seqs: int
    wake_fixed_s: float
    sleep_fixed_s: float


def mean_decode_tokens(median: float, sigma: float, cap: int) -> float:
    """Mean of the workload's log-normal decode length (median·e^(σ²/2)), at most the cap."""
    return min(float(cap), median * math.exp(sigma * sigma / 2.0))


def train_s_per_trajectory(a: Arch, tokens: float, flops: float, e: Efficiency) -> float:
    work = 6.0 * a.active_params * tokens + 6.0 * a.layers * a.hidden_size * tokens * tokens
    return work / (flops * e.train_mfu)


def log_probs_s_per_trajectory(a: Arch, tokens: float, flops: float, e: Efficiency) -> float:
    work = 2.0 * a.active_params * tokens + 2.0 * a.layers * a.hidden_size * tokens * tokens
    return work / (flops * e.train_mfu)


def kv_bytes_per_token(a: Arch) -> float:
    return 2.0 * a.layers * a.kv_dim * a.bytes_per_param


def decode_curve(a: Arch, tp: int, mean_ctx: float, flops: float, hbm: float, link: float,
                 e: Efficiency) -> Dict[str, float]:
    """``tokens_per_s_per_rank`` and ``batching_half_point`` of one rank (see the module doc)."""
    weights = a.params * a.bytes_per_param
    fixed = weights / (tp * hbm * e.hbm_efficiency) + (4 * a.layers * e.allreduce_latency_s if tp > 1 else 0.0)
    per_seq = (2.0 * a.active_params / (tp * flops * e.decode_flops_efficiency)
               + kv_bytes_per_token(a) * mean_ctx / (tp * hbm * e.hbm_efficiency))
    if tp > 1:
        per_seq += 4.0 * a.layers * a.hidden_size * a.bytes_per_param * (tp - 1) / tp / link
    return {"tokens_per_s_per_rank": 1.0 / per_seq, "batching_half_point": fixed / per_seq}


def kv_capacity(a: Arch, tp: int, vram: float, kv_cache_fraction: float, tokens: float, e: Efficiency) -> int:
    """Sequences of ``tokens`` a rank's KV cache holds (<= max_num_seqs; may be 0)."""
    free = tp * vram * kv_cache_fraction - a.params * a.bytes_per_param
    return max(0, min(e.max_num_seqs, int(free // (kv_bytes_per_token(a) * tokens))))


def wake_sleep_s(a: Arch, tp: int, pcie: float, sleep_level: int, e: Efficiency) -> Dict[str, float]:
    moved = a.params * a.bytes_per_param / tp / pcie if sleep_level == 1 else 0.0
    return {"wake_s": e.wake_fixed_s + moved, "sleep_s": e.sleep_fixed_s + moved}
