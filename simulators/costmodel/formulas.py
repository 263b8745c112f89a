"""Cost formulas, each written once. Units: seconds, bytes, FLOP, tokens.

Notation: N = parameters (N_act: active per token, = N for a dense model), L = layers,
d = hidden size, kv = KV heads x head dim, b = bytes per parameter (and per KV element),
T = tokens of one trajectory (prompt + decode), F = the GPU's dense peak FLOP/s, B = its
HBM bytes/s.

* Training, per trajectory on one GPU: (6·N_act·T + 6·L·d·T²) / (F · mfu). 6·N·T
  is the forward + backward matmul work (Kaplan et al. 2020, "Scaling Laws for Neural
  Language Models", §2.1); 6·L·d·T² the causal attention scores and context, forward and
  backward (2·L·d·T² forward: half of the full 4·L·d·T² because of the causal mask).
  MFU is the usual model-FLOPs utilization (``train_mfu``; ``moe_train_mfu`` for a mixture
  of experts, whose many small expert matmuls reach less of peak); the simulator divides by
  the training GPUs.
* Log-probs (forward only): (2·N_act·T + 2·L·d·T²) / (F · mfu).
* Training parallelism (:func:`train_pass_s`; a step's ``n`` sequences on ``G`` GPUs laid
  out as TP×PP×CP×DP, EP for the experts), from Narayanan et al. 2021, "Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC '21):
    - pipeline bubble (§2.2.1, the 1F1B schedule): the compute is stretched by
      1 / (1 − (p−1)/(m+p−1)), m = microbatches a pipeline runs per optimizer step
      = global_batch / (DP · micro_batch);
    - tensor-parallel communication (§3.2 / Fig. 4 of the same paper; Korthikanti et al.
      2022 for sequence parallelism, same bytes): per layer, 2 all-reduces forward and 2
      backward of the microbatch's activations (tokens·d·b bytes); a ring all-reduce moves
      2(t−1)/t of them per GPU;
    - data-parallel gradient reduction: once per optimizer step, a ring all-reduce (or the
      distributed optimizer's reduce-scatter + all-gather: the same bytes) of the GPU's
      gradient shard (N/(TP·PP), the experts' further split EP ways) at ``grad_bytes``;
    - context parallelism (ring attention, Liu et al. 2023): each GPU passes its KV chunk
      (2·kv·b per token and layer) to the cp−1 others, forward once and backward twice;
    - expert parallelism (the MoE token dispatch and combine, Lepikhin et al. 2020
      "GShard"): per MoE layer, 2 all-to-alls forward and 2 backward, each moving a token's
      k routed copies (k·d·b bytes), of which (ep−1)/ep leave the GPU; the group is ep
      consecutive GPUs (expert TP 1, Megatron's MoE parallel folding: :data:`EP_GROUP_SOURCE`),
      so EP8 stays in a node whatever the attention's TP; a group over several nodes sends
      its in-node share over NVLink and the rest over the NICs at once (:func:`ep_alltoall_s`);
    - full activation recomputation (``recompute``, a recipe's ``activation_checkpointing``:
      :data:`RECOMPUTE_SOURCE`): the backward reruns each layer's forward, so the training
      pass does 4 passes of matmul work instead of 3 (8·N·T instead of 6·N·T) and each
      forward collective (TP all-reduce, EP all-to-all, CP exchange) runs once more.
    - sequence packing (``train_pack_tokens`` / ``log_prob_pack_tokens``, NeMo RL's bins of
      ``train_mb_tokens`` / ``logprob_mb_tokens``): m counts the bins a rank runs, and under
      PP every microbatch computes the longest bin's tokens (``simulators/costmodel/packing.py``).
  Every communication is counted as not overlapped with compute (Megatron overlaps some of
  it; ``link_efficiency`` scales every link figure). A group's link is NVLink while it fits
  in a node, else the node's NICs (per GPU: the node's figure / GPUs per node).
* Decode, one step of a rank (a TP bundle of ``tp`` GPUs) serving ``c`` sequences — the
  roofline read as a sum (memory time plus compute time; NVIDIA's "Mastering LLM
  Techniques: Inference Optimization" and vLLM's own sizing notes reason the same way):
      t(c) = W/(tp·B·hbm_eff) + 4·L·α·[tp>1]
             + c · ( 2·N_act/(tp·F·decode_eff) + kv_bytes(ctx)/(tp·B·hbm_eff)
                     + 4·L·d·b·(tp-1)/tp / link )
  W = N·b is read once per step; each sequence adds its matmuls, its KV cache read
  (kv_bytes(ctx) = 2·L·kv·b·ctx at the mean context; the simulator moves it to each running
  sequence's own context, ``decode_kv_s_per_token``: ``simulators/pipelines/decode_clock.py``)
  and its share of the two TP
  all-reduces per layer (ring: 2(tp-1)/tp of the bytes each; α the per-all-reduce latency).
  A TP group wider than a node adds, per all-reduce, what the network adds to NCCL's
  latency (:func:`cross_node_allreduce_latency_s`: vLLM's custom all-reduce works only inside
  a node, so such a group all-reduces through NCCL over the NICs) on each of the two
  all-reduces of every layer (:data:`DECODE_ALLREDUCES_SOURCE`).
  So t(c) = a + β·c and the rank's throughput c/t(c) = (1/β)·c/(c + a/β): exactly the
  simulator's batching curve T·c/(c + h) with T = 1/β (``tokens_per_s_per_rank``) and
  h = a/β (``batching_half_point``). The simulator charges it per decode step at that
  step's c (``decode_timing: per_step``): a batch's last, longest sequences decode at
  t(1), not at the full batch's rate.
* Mixture of experts: W counts every routed expert, read in full only when the step's c
  tokens route to all of them. Each token picks k of E experts, so an expert is missed
  with probability (1 − k/E)^c and a step reads W_exp·(1 − (1 − k/E)^c) of the routed
  experts' weights W_exp = b·(N − N_act)/(1 − k/E) (split tp ways like the rest; vLLM's
  fused-MoE kernel loads only experts with tokens: :data:`FUSED_MOE_SOURCE`). The
  full-coverage read stays in a (``decode_expert_read_s`` = W_exp/(tp·B·hbm_eff)); the
  simulator's step subtracts the unread share. At the batch sizes of a rollout (c in the
  hundreds, k/E = 1/16) the step reads all of them; a lone sequence reads k/E of them.
  The routed experts' share of N_act runs at ``moe_decode_flops_efficiency`` instead of
  ``decode_flops_efficiency`` (measured: ``simulators/costmodel/moe.py``).
* KV capacity: (tp·vram·kv_cache_fraction − W) / kv_bytes(T_mean), capped at the engine's
  ``max_num_seqs`` (vLLM's default 256): ``max_concurrent_per_rank``.
* Wake and sleep: the fixed parts only (:func:`wake_sleep_s`). At level 1 the simulator
  adds (W/tp)/pcie where its host-RAM ledger moves the weights (a sleep, and a wake that
  finds them on the host); level 2 drops them (the sync brings them back).
* FSDP2 training (``train_backend: fsdp2``, with Ulysses sequence parallelism ``train_sp``):
  ``simulators/costmodel/fsdp2.py``.
* The weight sync (refit), from the CPU bucket cache or NeMo RL's colocated hand-over:
  ``simulators/costmodel/refit_formulas.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Dict, Optional

from harness.ordered_sum import ordered_sum
from simulators.costmodel.packing import PackedPass
from simulators.costmodel.moe import (  # noqa: F401  (re-exported: a MoE's decode terms)
    FUSED_MOE_SOURCE,
    expected_experts_read,
    expert_matmul_s_per_seq,
    routed_active_params,
    routed_expert_params,
)


@dataclass(frozen=True)
class Arch:
    params: float
    active_params: float
    layers: int
    hidden_size: int
    kv_dim: int  # KV heads x head dim
    bytes_per_param: int
    experts_per_token: int = 0  # routed experts per token (top-k); 0 = a dense model
    num_experts: int = 0  # routed experts per MoE layer (E); 0 = dense, or not given

    @property
    def moe(self) -> bool:
        return self.experts_per_token > 0


@dataclass(frozen=True)
class Efficiency:
    train_mfu: float
    decode_flops_efficiency: float
    hbm_efficiency: float
    allreduce_latency_s: float
    max_num_seqs: int
    wake_fixed_s: float
    sleep_fixed_s: float
    moe_train_mfu: float = 0.16
    link_efficiency: float = 1.0
    grad_bytes: int = 4
    decode_step_overhead_s: float = 0.0  # the engine's host work per decode step, not overlapped
    moe_decode_flops_efficiency: float = 0.04  # the routed experts' decode matmuls (simulators/costmodel/moe.py)

    def mfu(self, a: "Arch") -> float:
        return self.moe_train_mfu if a.moe else self.train_mfu


@dataclass(frozen=True)
class Parallel:
    """A training layout: TP×PP×CP×DP GPUs (EP splits the experts over the DP×CP×TP ranks)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    micro_batch: int = 1  # sequences per microbatch
    global_batch: int = 0  # sequences per optimizer step; 0 = a step's whole batch
    recompute: bool = False  # full activation recomputation: the backward reruns each layer's forward
    backend: str = "megatron"  # or "fsdp2": every training GPU one FSDP shard (simulators/costmodel/fsdp2.py)
    sp: int = 1  # fsdp2's Ulysses sequence parallelism: GPUs that split one microbatch's sequence


@dataclass(frozen=True)
class Links:
    """Per GPU and direction (bytes/s): NVLink inside a node, the NIC share across nodes."""

    intra: float
    inter: float
    gpus_per_node: int

    def for_group(self, span: int, e: Efficiency) -> float:
        """The link a group of ``span`` consecutive GPUs communicates over."""
        return (self.intra if span <= self.gpus_per_node else self.inter) * e.link_efficiency


def layout_problem(gpus: int, p: Parallel) -> Optional[str]:
    """Why ``gpus`` training GPUs cannot take layout ``p`` (None: they can)."""
    if p.backend == "fsdp2":
        if (p.tp, p.pp, p.cp, p.ep) != (1, 1, 1, 1):
            return "fsdp2 shards over every training GPU: train_tp, train_pp, train_cp and train_ep stay 1 (train_sp splits sequences)"
        if gpus % p.sp:
            return f"{gpus} training GPUs are not a multiple of train_sp {p.sp}"
        return None
    if p.sp != 1:
        return "train_sp is fsdp2's Ulysses sequence parallelism (Megatron's is train_cp)"
    if gpus % (p.tp * p.pp * p.cp):
        return f"{gpus} training GPUs are not a multiple of tp x pp x cp = {p.tp * p.pp * p.cp}"
    if (gpus // p.pp) % p.ep:
        return f"ep {p.ep} does not divide the {gpus // p.pp} GPUs of a pipeline stage"
    return None


def train_pass_s(
    a: Arch,
    p: Parallel,
    seqs: int,
    tokens: float,
    gpus: int,
    flops: float,
    links: Links,
    e: Efficiency,
    backward: bool = True,
    packed: Optional[PackedPass] = None,
) -> Dict[str, float]:
    """Wall seconds of one training (``backward``) or log-prob pass over ``seqs`` sequences
    of ``tokens`` tokens on ``gpus`` GPUs laid out as ``p``, by part (see the module doc).
    A ``packed`` pass (``simulators/costmodel/packing.py``) runs its microbatches and
    computes its padded tokens in the matmuls and collectives; attention stays per sequence."""
    dp = gpus // (p.tp * p.pp * p.cp)
    recompute = backward and p.recompute  # the backward reruns the forward (:data:`RECOMPUTE_SOURCE`)
    k = (4.0 if recompute else 3.0) if backward else 1.0  # forward (+ recomputed forward) + backward (2x)
    computed = tokens * packed.padding if packed is not None else tokens
    work = 2.0 * k * seqs * (a.active_params * computed + a.layers * a.hidden_size * tokens * tokens)
    compute = work / (gpus * flops * e.mfu(a))
    per_step = p.global_batch or seqs
    m = packed.microbatches if packed is not None else max(1, -(-per_step // (dp * p.micro_batch)))
    bubble = compute * (p.pp - 1) / m  # compute / (1 - (p-1)/(m+p-1)) - compute
    stage_layers = a.layers / p.pp
    tok_gpu = seqs * computed / (dp * p.cp)  # tokens a TP group of one stage handles
    b = a.bytes_per_param
    out = {"compute": compute, "pp_bubble": bubble, "tp_comm": 0.0, "cp_comm": 0.0, "ep_comm": 0.0, "dp_comm": 0.0}
    # per layer: 2 collectives each forward (the recomputed one too), 2 more in the backward
    collectives = 2.0 * (2.0 if recompute else 1.0) + (2.0 if backward else 0.0)
    if p.tp > 1:
        volume = collectives * stage_layers * tok_gpu * a.hidden_size * b * 2.0 * (p.tp - 1) / p.tp
        out["tp_comm"] = volume / links.for_group(p.tp, e)
    if p.cp > 1:
        out["cp_comm"] = (
            k * stage_layers * tok_gpu * 2.0 * a.kv_dim * b * (p.cp - 1) / p.cp / links.for_group(p.tp * p.cp, e)
        )
    if a.moe and p.ep > 1:
        copies = collectives * stage_layers * (tok_gpu / p.tp) * a.experts_per_token * a.hidden_size * b
        out["ep_comm"] = ep_alltoall_s(copies, p.ep, links, e)  # expert TP 1: ep consecutive GPUs (EP_GROUP_SOURCE)
    if backward and dp > 1:
        shard = a.params / (p.tp * p.pp * (p.ep if a.moe else 1)) * e.grad_bytes
        steps = -(-seqs // per_step)
        out["dp_comm"] = steps * 2.0 * (dp - 1) / dp * shard / links.for_group(gpus, e)
    out["total"] = ordered_sum(out.values())
    return out


#: where full activation recomputation is read from: NeMo RL maps a recipe's
#: ``activation_checkpointing: true`` to Megatron's ``recompute_granularity="full"``,
#: ``recompute_method="uniform"``, ``recompute_num_layers=1`` (every layer's forward is rerun
#: in the backward); Narayanan et al. 2021 count the training pass with it as 4 passes (their
#: eq. 3, 96·B·s·l·h²: forward, recomputed forward, backward twice) against 3 without
RECOMPUTE_SOURCE = (
    "NVIDIA-NeMo/RL",
    "nemo_rl/models/megatron/setup.py (aea463dd2dad3c9dd39d92df3a1616647c8ff45a); "
    "nemo_rl/models/policy/workers/megatron_policy_worker.py",
    "108bffdab368507a5500f27089ea2e7d90a06dea",
)

#: where the expert-parallel group's GPUs are read from: Megatron Core's MoE parallel folding
#: lays the expert layers out by their own rank generator (expert TP × EP × expert DP × PP,
#: order tp-cp-ep-dp-pp), so with expert TP 1 (NeMo RL's ``expert_tensor_parallel_size: 1``)
#: an EP group is ep consecutive GPUs, whatever the attention's TP
EP_GROUP_SOURCE = (
    "NVIDIA/Megatron-LM",
    "megatron/core/parallel_state.py (initialize_model_parallel: expert_decoder_rank_generator)",
    "NVIDIA-NeMo/RL examples/configs/grpo_math_1B.yaml",
)


def ep_alltoall_s(copies_bytes: float, ep: int, links: Links, e: Efficiency) -> float:
    """Seconds of a GPU's all-to-alls among an EP group of ``ep`` consecutive GPUs that send
    ``copies_bytes`` in all (an equal 1/ep to each member, itself included). An all-to-all
    is a send and a receive per peer, and NCCL picks each peer pair's own transport
    (:data:`NCCL_PEER_TRANSPORT_SOURCE`): NVLink to the peers in the node, the network to
    the others, both at once. So a group inside a node moves (ep−1)/ep of the bytes over
    NVLink; a group over n whole nodes moves (g−1)/ep over NVLink and (ep−g)/ep over the
    GPU's NIC share (g GPUs a node), and the slower of the two is the time. (A ring
    collective differs: every byte crosses the ring's slowest hop, hence ``for_group``.)"""
    g = links.gpus_per_node
    if ep <= g:
        return copies_bytes * (ep - 1) / ep / links.for_group(ep, e)
    in_node = copies_bytes * (g - 1) / ep / links.for_group(g, e)
    off_node = copies_bytes * (ep - g) / ep / links.for_group(ep, e)
    return max(in_node, off_node)


#: where an all-to-all's per-peer links are read from: NCCL chooses the transport of each
#: peer pair (NVLink P2P inside a node, InfiniBand or TCP across), and an all-to-all is one
#: send and receive per peer
NCCL_PEER_TRANSPORT_SOURCE = (
    "NVIDIA/nccl",
    "docs/contrib/GIN/NCCL_Gin_and_Symmetric_Memory/NCCL_Gin_and_Symmetric_Memory.md (Initialization: transport setup)",
    "5067397c2676d5aed50042fc39e5c8ee96eb0027",
)


def mean_decode_tokens(median: float, sigma: float, cap: int, cap_share: float = 0.0) -> float:
    """Mean decode length the workload draws: a log-normal (median m, log-space σ) cut at the
    cap, E[min(L, c)] = m·e^(σ²/2)·Φ(z_c − σ) + c·(1 − Φ(z_c)), z_c = ln(c/m)/σ — the
    uncapped mean m·e^(σ²/2) where the cap is far, less where it bites (a run's published
    mean length is of the lengths it generated, which the cap cut). With ``cap_share`` s
    (``workload.decode_tokens_cap_share``) the draws above the normal's (1 − s) quantile z_s
    run to the cap, so z_c becomes min(z_c, z_s) in the same expression."""
    phi = lambda x: 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
    if sigma <= 0:
        return (1.0 - cap_share) * min(float(cap), float(median)) + cap_share * cap
    z = math.log(cap / median) / sigma
    z_s = cap_quantile(cap_share)
    if z_s is not None:
        z = min(z, z_s)
    return median * math.exp(sigma * sigma / 2.0) * phi(z - sigma) + cap * (1.0 - phi(z))


def cap_quantile(share: float) -> Optional[float]:
    """The standard-normal draw above which an answer runs to the cap, so that ``share`` of
    the draws do (``workload.decode_tokens_cap_share``); None for no such share. The one
    rule both the workload's draws (``simulators/pipelines/workload.py``, ``single_controller.py``)
    and :func:`mean_decode_tokens` follow."""
    if share <= 0 or 1.0 - share >= 1.0:  # a share below float resolution: no draw runs to the cap
        return None
    return NormalDist().inv_cdf(1.0 - share)


def median_for_mean(mean: float, sigma: float, cap: int, cap_share: float = 0.0) -> float:
    """The log-normal median whose capped mean (:func:`mean_decode_tokens`) is ``mean``
    (between cap_share·cap and the cap), by bisection on the median (the capped mean grows
    with it)."""
    if not cap_share * cap < mean < cap:
        raise ValueError(f"a mean of {mean} tokens needs {cap_share * cap:g} < mean < cap {cap}")
    lo, hi = 1e-9, float(cap)
    while mean_decode_tokens(hi, sigma, cap, cap_share) < mean:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if mean_decode_tokens(mid, sigma, cap, cap_share) < mean else (lo, mid)
    return (lo + hi) / 2.0


def train_s_per_trajectory(a: Arch, tokens: float, flops: float, e: Efficiency) -> float:
    work = 6.0 * a.active_params * tokens + 6.0 * a.layers * a.hidden_size * tokens * tokens
    return work / (flops * e.mfu(a))


def log_probs_s_per_trajectory(a: Arch, tokens: float, flops: float, e: Efficiency) -> float:
    work = 2.0 * a.active_params * tokens + 2.0 * a.layers * a.hidden_size * tokens * tokens
    return work / (flops * e.mfu(a))


def kv_bytes_per_token(a: Arch) -> float:
    return 2.0 * a.layers * a.kv_dim * a.bytes_per_param


#: where a decode step's all-reduces are counted from: two a layer (the attention's output
#: projection, a row-parallel linear that reduces its result, and the MLP's or the expert
#: block's output), and vLLM's custom all-reduce refusing a group that spans nodes (NCCL then)
DECODE_ALLREDUCES_SOURCE = (
    "vllm-project/vllm",
    "vllm/model_executor/models/qwen3_moe.py (Qwen3MoeAttention.o_proj, Qwen3MoeSparseMoeBlock.forward) at "
    "002456df36fc7a63ca4463f335a49d05634ab2ab; vllm/distributed/device_communicators/custom_all_reduce.py "
    "(CustomAllreduce.__init__: 'disabled because this process group spans across nodes')",
    "00d618aab60448acdf3fac3e9c4e2e22d0c6c753",
)
#: NCCL's latency model of an all-reduce (its tree algorithm with the LL protocol, the
#: low-latency choice for a decode step's small messages): per hop 0.52 µs over NVLink and
#: 5.0 µs over the network, the in-node hops 1.8 times slower once the group spans nodes
NCCL_LATENCY_SOURCE = (
    "NVIDIA/nccl",
    "src/graph/tuning.cc (hwLat, ncclTopoTuneModel)",
    "01afd20a77b5804e0ecf1042509dd9d20ebf9e93",
)
NCCL_TREE_LL_NVLINK_HOP_S = 0.52e-6
NCCL_TREE_LL_NET_HOP_S = 5.0e-6
NCCL_LL_MULTI_NODE_INTRA_FACTOR = 1.8


def cross_node_allreduce_latency_s(tp: int, gpus_per_node: int) -> float:
    """What spanning nodes adds to one all-reduce's latency in a TP group of ``tp``
    consecutive GPUs: NCCL's tree/LL latency on the group's nodes less the same group's
    latency inside one node (:data:`NCCL_LATENCY_SOURCE`: up and down the tree, each of the
    r − 1 in-node hops slower by the multi-node factor, and log2(nodes) network hops).
    Zero for a group inside a node (``gpus_per_node`` 0: unknown, taken as one node)."""
    if gpus_per_node <= 0 or tp <= gpus_per_node:
        return 0.0
    nodes = -(-tp // gpus_per_node)
    ranks_per_node = tp // nodes
    intra = (ranks_per_node - 1) * NCCL_TREE_LL_NVLINK_HOP_S * (NCCL_LL_MULTI_NODE_INTRA_FACTOR - 1.0)
    return 2.0 * (intra + (nodes.bit_length() - 1) * NCCL_TREE_LL_NET_HOP_S)


def decode_allreduce_latency_s(a: Arch, tp: int, gpus_per_node: int, e: Efficiency) -> float:
    """The all-reduces' fixed latency in one decode step of a TP group (the module doc)."""
    if tp <= 1:
        return 0.0
    return 4 * a.layers * e.allreduce_latency_s + 2 * a.layers * cross_node_allreduce_latency_s(tp, gpus_per_node)


def decode_curve(
    a: Arch,
    tp: int,
    mean_ctx: float,
    flops: float,
    hbm: float,
    link: float,
    e: Efficiency,
    gpus_per_node: int = 0,
) -> Dict[str, float]:
    """``tokens_per_s_per_rank`` and ``batching_half_point`` of one rank (see the module doc);
    ``gpus_per_node`` places the TP group (0: inside one node)."""
    weights = a.params * a.bytes_per_param
    fixed = (
        weights / (tp * hbm * e.hbm_efficiency)
        + decode_allreduce_latency_s(a, tp, gpus_per_node, e)
        + e.decode_step_overhead_s
    )
    kv_s = kv_bytes_per_token(a) / (tp * hbm * e.hbm_efficiency)  # a step's read of one cached token
    per_seq = 2.0 * a.active_params / (tp * flops * e.decode_flops_efficiency) + kv_s * mean_ctx
    if tp > 1:
        per_seq += 4.0 * a.layers * a.hidden_size * a.bytes_per_param * (tp - 1) / tp / link
    per_seq += expert_matmul_s_per_seq(a, tp, flops, e.decode_flops_efficiency, e.moe_decode_flops_efficiency)
    experts = routed_expert_params(a) * a.bytes_per_param / (tp * hbm * e.hbm_efficiency)
    return {
        "tokens_per_s_per_rank": 1.0 / per_seq,
        "batching_half_point": fixed / per_seq,
        "decode_timing": "per_step",
        "decode_expert_read_s": experts,
        "decode_kv_s_per_token": kv_s,
    }


def kv_capacity(a: Arch, tp: int, vram: float, kv_cache_fraction: float, tokens: float, e: Efficiency) -> int:
    """Sequences of ``tokens`` a rank's KV cache holds (<= max_num_seqs; may be 0)."""
    free = tp * vram * kv_cache_fraction - a.params * a.bytes_per_param
    return max(0, min(e.max_num_seqs, int(free // (kv_bytes_per_token(a) * tokens))))


def wake_sleep_s(e: Efficiency) -> Dict[str, float]:
    """The fixed parts of a wake and a sleep only. A level-1 sleep's copy of the weights over
    the host link is charged by the simulator where its host-RAM ledger moves them
    (``simulators/pipelines/ranks.py``: a GPU's share of the weights over ``pcie_bytes_per_s``), so a
    wake copies back exactly what a sleep left on the host, and a first wake nothing."""
    return {"wake_s": e.wake_fixed_s, "sleep_s": e.sleep_fixed_s}
