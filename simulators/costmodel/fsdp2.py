"""FSDP2 training (PyTorch's ``fully_shard``), with Ulysses sequence parallelism: one pass's
wall time by part, beside Megatron's :func:`simulators.costmodel.formulas.train_pass_s`.

verl trains its actor this way (volcengine/verl ``verl/workers/fsdp_workers.py``,
``_build_model_optimizer``, and ``verl/workers/actor/dp_actor.py``: :data:`FSDP2_SOURCE`): every training GPU holds a 1/G shard
of the parameters, gradients and optimizer state (``fully_shard`` over the whole mesh with
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``), and ``reshard_after_forward``
(True by default) frees the gathered parameters after each layer's forward, so:

- **compute**: the same FLOPs as Megatron's (2·k·n·(N_act·T + L·d·T²) over G GPUs at the
  dense or MoE MFU; k = 3 training, 4 with activation recomputation, 1 forward only);
- **parameter all-gathers**: each microbatch gathers every layer's parameters (bf16, W = N·b
  bytes in all) for its forward, and again for its backward: an all-gather moves (G−1)/G
  of W per GPU (nccl-tests' figure, as :func:`refit_formulas.refit_gather_s` counts it);
- **gradient reduce-scatter**: each microbatch's backward reduce-scatters the gradients at
  ``grad_bytes`` (fp32, the ``reduce_dtype``): (G−1)/G of N·grad_bytes per GPU; verl's
  actor steps through its micro-batches with ``loss.backward()`` each, so this is paid per
  microbatch, not per optimizer step;
- **Ulysses sequence parallelism** (``train_sp`` = s; verl's ``ulysses_sequence_parallel_size``;
  Jacobs et al. 2023, "DeepSpeed Ulysses", §3): the s GPUs of a group each hold 1/s of a
  microbatch's tokens; per layer, all-to-alls re-split q, k and v by head before attention
  and the output back by token after it, each moving (s−1)/s of the GPU's share
  ((2·d + 2·kv)·b bytes a token); the forward does it once (twice with recomputation),
  the backward once more. A group of s consecutive GPUs uses NVLink while it fits a node.

Microbatches per GPU: ⌈n / (G/s · micro_batch)⌉ (an SP group runs one microbatch together).
The collectives are counted as not overlapped with compute (FSDP2 prefetches the next
layer's all-gather: an upper bound there, as for Megatron's). CPU offload of the training
state is the simulator's ``OffloadTraining`` / reload effects (``offload_bytes_per_s``), not
a term of this pass.
"""

from __future__ import annotations

from typing import Dict

from harness.ordered_sum import ordered_sum
from simulators.costmodel.formulas import Arch, Efficiency, Links, Parallel

FSDP2_SOURCE = (
    "volcengine/verl",
    "verl/workers/fsdp_workers.py (_build_model_optimizer: fully_shard with "
    "MixedPrecisionPolicy, reshard_after_forward) at b38119fa248231a6e1c6198d08c0a4e46354dd01; "
    "verl/workers/actor/dp_actor.py (update_policy: loss.backward() per micro-batch, one optimizer step "
    "per mini-batch)",
    "cc62eca95ed79d5a7270f3f92d20532a97b87c0e",
)


def fsdp2_pass_s(
    a: Arch,
    p: Parallel,
    seqs: int,
    tokens: float,
    gpus: int,
    flops: float,
    links: Links,
    e: Efficiency,
    backward: bool = True,
) -> Dict[str, float]:
    """Wall seconds of one FSDP2 training (``backward``) or forward-only pass over ``seqs``
    sequences of ``tokens`` tokens on ``gpus`` GPUs, by part (the module doc)."""
    recompute = backward and p.recompute
    k = (4.0 if recompute else 3.0) if backward else 1.0
    work = 2.0 * k * seqs * (a.active_params * tokens + a.layers * a.hidden_size * tokens * tokens)
    compute = work / (gpus * flops * e.mfu(a))
    groups = gpus // p.sp  # data-parallel groups, each running its own microbatches
    micro = max(1, -(-seqs // (groups * p.micro_batch)))
    spread = (gpus - 1) / gpus
    weights = a.params * a.bytes_per_param
    gathered = (2.0 if backward else 1.0) * weights * spread
    reduced = a.params * e.grad_bytes * spread if backward else 0.0
    out = {
        "compute": compute,
        "fsdp_gather": micro * gathered / links.for_group(gpus, e),
        "fsdp_reduce": micro * reduced / links.for_group(gpus, e),
        "sp_comm": 0.0,
    }
    if p.sp > 1:
        tok_gpu = seqs * tokens / gpus
        passes = (2.0 if recompute else 1.0) + (1.0 if backward else 0.0)
        per_layer = (2.0 * a.hidden_size + 2.0 * a.kv_dim) * a.bytes_per_param * tok_gpu * (p.sp - 1) / p.sp
        out["sp_comm"] = passes * a.layers * per_layer / links.for_group(p.sp, e)
    out["total"] = ordered_sum(out.values())
    return out
