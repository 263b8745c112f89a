"""Sequence packing: what a packed training or log-prob pass computes, and in how many
microbatches.

NeMo RL's Megatron path packs a batch's sequences into bins of at most ``C`` tokens
(``policy.sequence_packing.train_mb_tokens`` for training, ``logprob_mb_tokens`` for the
log-prob pass; its defaults are ``max_total_sequence_length`` × ``train_micro_batch_size``
and × ``logprob_batch_size``) and runs one bin per microbatch (:data:`PACKING_SOURCE`):

* **Which sequences share a bin.** Training packs each optimizer step's global batch on its
  own (``shard_by_batch_size`` with ``batch_size`` = the global batch); the log-prob pass
  packs the step's whole batch at once (``batch_size=None``). The bins are then dealt to the
  data-parallel ranks in turn, so a rank runs ceil(bins / DP) microbatches. The packer is
  NeMo RL's modified first-fit-decreasing; :func:`first_fit_decreasing` is the plain
  first-fit-decreasing it refines (both place the longest sequence first, each in the first
  bin it fits).
* **The pipeline's microbatches.** The 1F1B pipeline bubble (p−1)/(m+p−1) counts m in bins,
  not in sequences: a rank whose 128 sequences fill 18 bins runs 18 microbatches.
* **Padding under pipeline parallelism.** With PP > 1 every microbatch is padded to the
  longest bin of the rank's batch ("to maintain a static PP buffer"), so each of a rank's
  microbatches computes that many tokens, whatever its bin holds. A bin that holds one
  sequence of a length distribution with a long tail computes the tail's length.

What a pass computes is charged by :func:`simulators.costmodel.formulas.train_pass_s` from
:class:`PackedPass`: its matmuls and collectives over the padded tokens (the mean length
times the padding), its attention over the sequences' own (each packed sequence attends within itself; the padding is one segment).
Not charged: each sequence's round-up to a multiple of the CP × 2 × TP split (at most a few
dozen tokens a sequence).

The lengths packed are the workload's own distribution read at its quantiles
(:func:`quantile_lengths`), so the packing is a deterministic function of the scenario.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import List, Optional, Sequence

#: where the packing is read from: the bins (capacity, per-chunk packing, the deal to DP
#: ranks), the one-bin microbatches and the padding of every microbatch to the longest under PP
PACKING_SOURCE = (
    "NVIDIA-NeMo/RL",
    "nemo_rl/distributed/batched_data_dict.py (shard_by_batch_size: sequence_packing_args), "
    "nemo_rl/models/policy/lm_policy.py (train: batch_size=gbs; get_logprobs: batch_size=None), "
    "nemo_rl/models/policy/megatron_policy_worker.py (train, get_logprobs: pad_full_seq_to when "
    "pipeline_model_parallel_size > 1), examples/configs/grpo_math_1B_megatron.yaml (sequence_packing) "
    "at b1c86a816c5e2b4ca41ece193624a38dc62e6fdf; nemo_rl/models/megatron/data.py "
    "(_get_pack_sequence_parameters_for_megatron) at aea463dd2dad3c9dd39d92df3a1616647c8ff45a",
    "b1c86a816c5e2b4ca41ece193624a38dc62e6fdf",
)


@dataclass(frozen=True)
class PackedPass:
    """A packed pass over a step's sequences: the microbatches the busiest data-parallel rank
    runs per optimizer step, and the tokens it computes over the sequences' own tokens
    (>= 1: the padding; the busiest rank's count on every rank, since the pass ends with it)."""

    microbatches: int
    padding: float


def quantile_lengths(
    n: int, prompt: float, median: float, sigma: float, cap: float, cap_share: float = 0.0
) -> List[float]:
    """``n`` trajectory lengths (prompt + answer) at the mid-quantiles (i + ½)/n of the
    workload's answer lengths: a log-normal (median, σ) cut at the cap, its top ``cap_share``
    at the cap (the draw rule of ``simulators/pipelines/workload.py``)."""
    normal = NormalDist()
    top = normal.inv_cdf(1.0 - cap_share) if 0.0 < cap_share < 1.0 else math.inf
    out = []
    for i in range(n):
        z = normal.inv_cdf((i + 0.5) / n)
        answer = cap if z > top else min(cap, max(1.0, median * math.exp(sigma * z)))
        out.append(prompt + answer)
    return out


def first_fit_decreasing(lengths: Sequence[float], capacity: float) -> List[float]:
    """The bins' token counts: each length, longest first, into the first bin with room
    (a new bin where none has)."""
    bins: List[float] = []
    for length in sorted(lengths, reverse=True):
        for i, used in enumerate(bins):
            if used + length <= capacity:
                bins[i] = used + length
                break
        else:
            bins.append(length)
    return bins


def packed_pass(lengths: Sequence[float], capacity: float, chunk: int, dp: int, pp: int) -> Optional[PackedPass]:
    """The packed pass over ``lengths`` (one step's sequences), packed ``chunk`` sequences at
    a time (training: the global batch; the log-prob pass: all of them) into bins of
    ``capacity`` tokens dealt to ``dp`` ranks. The chunks interleave the lengths, so each is
    a sample of the whole distribution. None where a sequence is longer than a bin (the
    scenario check names it). With ``pp`` > 1 a rank computes each of its microbatches at
    the longest bin of its chunk (the module doc)."""
    if not lengths or max(lengths) > capacity:
        return None
    chunks = max(1, -(-len(lengths) // max(1, chunk)))
    microbatches, computed = 0, 0.0
    for j in range(chunks):
        bins = first_fit_decreasing(lengths[j::chunks], capacity)
        per_rank = -(-len(bins) // dp)
        microbatches = max(microbatches, per_rank)
        computed += dp * per_rank * max(bins) if pp > 1 else sum(bins)
    return PackedPass(microbatches, computed / sum(lengths))
