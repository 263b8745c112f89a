"""Cost formulas of the weight sync (refit), each written once; the notation of
``simulators/costmodel/formulas.py`` (W = the model's weight bytes).

* Refit from the CPU bucket cache (:func:`refit_s`, the closed form of what
  ``simulators/refit/sync.py`` charges): W·(1/pcie + 1/fabric + 1/load) + buckets·(2·τ_tensor + τ_group)
  + fixed; the fabric is NVLink inside a node, the NICs across nodes, none on the owner's GPU.
* NeMo RL's colocated refit (:func:`colocated_ipc_refit_s`): first every GPU gathers each
  tensor whole from the training layout (:func:`refit_gather_s`: the TP all-gather over
  NVLink, the PP broadcast over the NICs once the training GPUs span nodes, the EP
  all-gather), then packs it and hands it to its vLLM worker by CUDA IPC (HBM copies).
"""

from __future__ import annotations

import math
from typing import Dict, Optional

from harness.ordered_sum import ordered_sum
from simulators.costmodel.formulas import Arch, Efficiency, Links, Parallel, routed_expert_params


def refit_s(
    weight_bytes: float,
    bucket_bytes: int,
    pack_bytes_per_s: float,
    fabric_bytes_per_s: Optional[float],
    load_bytes_per_s: float,
    tensor_overhead_s: float = 0.0,
    group_overhead_s: float = 0.0,
    fixed_s: float = 0.0,
) -> float:
    """One selective sync from the CPU bucket cache, uncontended (``simulators/refit/sync.py``
    times it effect by effect; this is its closed form, for the docs' what-ifs). Per
    bucket of b bytes, behind a barrier: stage it over the owner's host link (b / pack),
    broadcast it over the fabric the targets sit behind (b / fabric: NVLink in a node, the
    NICs across nodes; none when every target shares the owner's GPU and takes the CUDA-IPC
    path), the receivers load it (b / load); plus per bucket two tensor overheads (stage
    and load) and one group round trip. ``fixed_s``: the sync's setup, completion and
    dynamic-group create/destroy. Bucket size enters only through the bucket count: the
    barrier lets no bucket's transfer overlap the next one's, so bigger buckets save
    overheads and nothing else."""
    buckets = max(1, math.ceil(weight_bytes / bucket_bytes))
    per_byte = (
        1.0 / pack_bytes_per_s + (1.0 / fabric_bytes_per_s if fabric_bytes_per_s else 0.0) + 1.0 / load_bytes_per_s
    )
    return weight_bytes * per_byte + buckets * (2.0 * tensor_overhead_s + group_overhead_s) + fixed_s


#: where :func:`colocated_ipc_refit_s` is read from (NeMo RL v0.3.0)
NEMO_RL_IPC_REFIT_SOURCE = (
    "NVIDIA-NeMo/RL",
    "nemo_rl/algorithms/grpo.py (refit_policy_generation); "
    "nemo_rl/models/policy/megatron_policy_worker.py (prepare_weights_for_ipc, "
    "get_weights_ipc_handles)",
    "b1c86a816c5e2b4ca41ece193624a38dc62e6fdf",
)


def colocated_ipc_refit_s(
    weight_bytes: float,
    group_bytes: int,
    hbm_bytes_per_s: float,
    hbm_efficiency: float,
    tensor_overhead_s: float = 0.0,
    group_overhead_s: float = 0.0,
    fixed_s: float = 0.0,
    gather_s: float = 0.0,
) -> float:
    """Standalone NeMo RL's colocated refit, the weight hand-over only (refit path
    ``colocated_ipc``; source :data:`NEMO_RL_IPC_REFIT_SOURCE`). Its
    ``refit_policy_generation`` splits the weights into groups that fit a refit buffer; per
    group the trainer on each GPU packs the group's tensors into one consolidated GPU
    tensor and passes its CUDA IPC handle to the vLLM worker on the same GPU, which copies
    the weights into place before the next group. Both copies read and write the group's b
    bytes in the same GPU's HBM, so each moves 2·b at B·hbm_eff and they cannot overlap
    (one memory); every GPU does this for its own worker at once. Per group: the pack (2·b /
    (B·hbm_eff) + one tensor overhead), the load (the same, + one tensor overhead + the
    group's round trip); ``fixed_s`` the stream's setup and completion. No host RAM, no PCIe,
    no fabric. ``gather_s``: gathering the training shards into whole tensors before they
    are packed (:func:`refit_gather_s`, ``costs.refit_gather_s``), charged group by group in
    proportion to its bytes. The offload of the trainer's optimizer state and the wake of
    vLLM's weights around it are the pipeline's own effects (``OffloadTraining``, ``Wake``),
    not here."""
    groups = max(1, math.ceil(weight_bytes / group_bytes))
    return (
        4.0 * weight_bytes / (hbm_bytes_per_s * hbm_efficiency)
        + groups * (2.0 * tensor_overhead_s + group_overhead_s)
        + fixed_s
        + gather_s
    )


#: where :func:`refit_gather_s` is read from: NeMo RL v0.3.0's own gather (``gather_params``:
#: TP all-gather on the owning stage, then the whole tensor broadcast over PP, then the EP
#: all-gather), Megatron-Bridge's export that NeMo RL v0.4 and later call (each mapping's
#: ``megatron_to_hf``: the TP shard broadcast over PP first, then the TP and EP all-gathers;
#: the commit NeMo RL v0.6.0 pins), Megatron-LM's rank order (``initialize_model_parallel``,
#: order "tp-cp-ep-dp-pp"; experts laid out "tp-ep-dp-pp" with the expert TP, which NeMo RL's
#: configs set to 1), and NCCL's collective times (nccl-tests' bus-bandwidth formulas)
REFIT_GATHER_SOURCES = (
    (
        "NVIDIA-NeMo/RL",
        "nemo_rl/models/megatron/refit_utils.py (gather_params); "
        "nemo_rl/models/policy/megatron_policy_worker.py (get_weights_ipc_handles)",
        "b1c86a816c5e2b4ca41ece193624a38dc62e6fdf",
    ),
    (
        "NVIDIA-NeMo/Megatron-Bridge",
        "src/megatron/bridge/models/conversion/param_mapping.py "
        "(broadcast_from_pp_rank, gather_from_tp_ranks, gather_from_ep_ranks)",
        "554c7b9324225aa863eee52e8b8fdde7abced2b1",
    ),
    (
        "NVIDIA/Megatron-LM",
        "megatron/core/parallel_state.py (initialize_model_parallel)",
        "2ff0f099ffc30ffd152e3e29e921a1609d00855c",
    ),
    (
        "NVIDIA-NeMo/RL",
        "examples/configs/grpo_math_qwen30ba3b_megatron.yaml (expert_tensor_parallel_size: 1)",
        "b1c86a816c5e2b4ca41ece193624a38dc62e6fdf",
    ),
    (
        "NVIDIA/nccl-tests",
        "doc/PERFORMANCE.md (broadcast t = S/B; all-gather t = S(n-1)/(nB))",
        "03a204a1f38aaea17f1a777885bb2d9600ba7eff",
    ),
)

#: the two ways NeMo RL's Megatron refit gathers a tensor whole (``PipelineSpec.refit_export``)
REFIT_EXPORTS = ("megatron_bridge", "gather_params")


def refit_gather_s(
    a: Arch, p: Parallel, gpus: int, links: Links, e: Efficiency, export: str = "megatron_bridge"
) -> Dict[str, float]:
    """Seconds each GPU spends gathering the training shards into whole tensors before NeMo
    RL's colocated refit hands them to vLLM, by group (sources: :data:`REFIT_GATHER_SOURCES`).

    Every GPU ends up holding every tensor whole, in Hugging Face's layout, one tensor (or
    one refit group) at a time, and its vLLM worker keeps its own slice: W bytes arrive,
    W = N·b, of which W_x are the routed experts (:func:`routed_expert_params`; 0 where the
    model gives no ``num_experts``, every weight then counted as a dense, TP-sharded one) and
    W_d = W − W_x the rest. The collectives run one tensor after another, every GPU taking
    part in each, so a group's time is the sum over tensors of one collective's time,
    which NCCL sets by the bytes over the group's link (B, :meth:`Links.for_group`):

    * TP all-gather of the dense tensors, S·(t−1)/t / B each: W_d·(t−1)/t / B_tp; the
      experts are not TP-sharded (expert TP 1);
    * PP broadcast from the stage that owns the tensor, S / B each (the root sends the whole
      of it; the ring passes it on): ``gather_params`` (NeMo RL v0.3) broadcasts the
      gathered whole tensor, (W_d + W_x/ep) / B_pp; ``megatron_bridge`` (v0.4 on) the TP
      shard before gathering it, (W_d/t + W_x/ep) / B_pp;
    * EP all-gather of each local expert: W_x·(ep−1)/ep / B_ep.

    The groups' spans come from Megatron's rank order (TP innermost, PP outermost): TP t
    consecutive GPUs, EP ep consecutive GPUs, a PP group one GPU every G/p, spanning
    (p−1)·G/p + 1 — across nodes as soon as the training GPUs fill more than one node, so
    that broadcast goes over the NICs. Per-collective latencies are left out (a few hundred
    tensors × tens of µs: under 0.1 s for a 70B), and so is the Megatron → Hugging Face
    conversion's own work (a reshape or a QKV split per tensor), for which no measured
    figure was found."""
    if export not in REFIT_EXPORTS:
        raise ValueError(f"refit export {export!r} is not one of {REFIT_EXPORTS}")
    b = a.bytes_per_param
    w_x = routed_expert_params(a) * b
    w_d = a.params * b - w_x
    ep = p.ep if a.moe else 1
    out = {"tp": 0.0, "pp": 0.0, "ep": 0.0}
    if p.tp > 1:
        out["tp"] = w_d * (p.tp - 1) / p.tp / links.for_group(p.tp, e)
    if p.pp > 1:
        dense = w_d if export == "gather_params" else w_d / p.tp
        out["pp"] = (dense + w_x / ep) / links.for_group((p.pp - 1) * (gpus // p.pp) + 1, e)
    if ep > 1 and w_x:
        out["ep"] = w_x * (ep - 1) / ep / links.for_group(ep, e)
    out["total"] = ordered_sum(out.values())
    return out
