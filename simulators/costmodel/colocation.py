"""Training on GPUs of its own against training on GPUs it shares with a sleeping inference
engine: one named factor, :data:`COLOCATED_TRAIN_FACTOR`.

Why it exists. The cost model's training rate (``train_mfu``) was set on colocated runs (the
NeMo RL rows of ``examples/published/``, every one a hybrid engine that sleeps its inference
engine while it trains), so it is the rate of *colocated* training. Published runs of the
same workload on dedicated training GPUs train markedly faster per GPU: in volcengine/verl
``docs/advance/fully_async.md`` at ca44f950630c2bc46303c88f546a69d322dbcfba ("Asynchronous
Training on 7B Model"), the colocated run's ``update_actor`` takes 1.70-2.01 times the
GPU-seconds of the fully asynchronous run's on its own training GPUs, with the same batch,
layout (FSDP2, Ulysses SP 4) and dynamic micro-batching (``ppo_max_token_len_per_gpu`` alike).

What differs between the two recipes is what colocation forces: the colocated recipe
(volcengine/verl ``recipe/dapo/test_dapo_7b_math.sh`` at
3592251ee1a5c2fae6bddcf3e51440cab63c07bd) turns on the actor's
``fsdp_config.param_offload`` and ``optimizer_offload`` (and the reference's) so that the
sleeping vLLM engine and the trainer fit one GPU; the dedicated one
(``recipe/fully_async_policy/shell/dapo_7b_math_fsdp2_64_64.sh`` at
1b9356abf3b0dd258622067a9ce141d59c8f5226) sets ``actor_offload=False``. The bytes of that
offload over the host link are far too few to explain the gap (a 7B's FP32 parameters and Adam
moments over 32 GPUs: about 2.9 GB a GPU, under a tenth of a second each way; the simulator's
``OffloadTraining`` effect charges them already), and no source found measures the rest
(allocator cache flushes, the phase's reload and re-shard, memory left to activations). So
the mechanism is not split into terms: the factor is the measured ratio as a whole, charged
where its cause is (training whose GPUs host an inference engine), and nowhere else.

How it is applied. The training pass of a pipeline none of whose training GPUs is an
inference GPU of any pipeline in the scenario (a disaggregated shape) is charged
:func:`train_s` = the colocated-rate figure / the factor; every other pipeline keeps the
figure as it was (so every colocated run the rate was set on is unchanged). Only training is
scaled: the fitting rows publish no log-prob pass on dedicated GPUs (their rollouts return the
log-probs), so nothing sources a factor for it. A mixture of experts is the other way round:
its rate (``moe_train_mfu``) comes from a pretraining run on GPUs of its own
(:data:`MOE_TRAIN_RATE_SOURCE`), so its training pass is charged that rate on dedicated GPUs
and the factor times it where the training GPUs host an inference engine (its log-prob pass
keeps the one rate, as a dense model's does).

Fitted value. The geometric mean of the colocated / dedicated training GPU-seconds over the
published pairs of the comparison set whose two rows are both in its fitted split and publish
their training seconds
(``examples/published/comparison/set.yaml``: colocated 32 against fully asynchronous 16:16,
1.720; colocated 128 against 64:64, 2.012), ``benchmarks/published_comparison.py --fit``
recomputes it; the held-out pairs' figures are not read. The evidence is verl's FSDP2 on H20
only; applying it to Megatron training on dedicated GPUs is an extrapolation.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

#: GPU-seconds of training on GPUs shared with a sleeping inference engine over those of the
#: same training on GPUs of its own (the module doc: sourced ratio, fitted value).
COLOCATED_TRAIN_FACTOR = 1.86


def trains_on_dedicated_gpus(pipelines: Sequence[Any], index: int) -> bool:
    """Whether pipeline ``index`` trains on GPUs no pipeline of the scenario infers on.
    A pipeline whose GPU lists are missing or malformed counts as colocated (validation
    names the field; the figure then stays as it was)."""

    def gpus(pipe: Any, key: str):
        value = pipe.get(key) if isinstance(pipe, Mapping) else None
        if not isinstance(value, (list, tuple)) or not value:
            return None
        return {g for g in value if isinstance(g, int) and not isinstance(g, bool)}

    train = gpus(pipelines[index], "train_gpus")
    if not train:
        return False
    for pipe in pipelines:
        infer = gpus(pipe, "infer_gpus")
        if infer is None or train & infer:
            return False
    return True


def train_s(rate_s: float, dedicated: bool, moe: bool = False) -> float:
    """Training seconds on a pipeline's GPUs from a pass timed at the cost model's rate. A
    dense model's rate (``train_mfu``) is colocated training's: on dedicated GPUs it is
    divided by :data:`COLOCATED_TRAIN_FACTOR`. A mixture of experts' rate (``moe_train_mfu``)
    was measured on GPUs of its own (:data:`MOE_TRAIN_RATE_SOURCE`): on GPUs that host an
    inference engine it is multiplied by the factor, on dedicated ones it stands."""
    if moe:
        return rate_s if dedicated else rate_s * COLOCATED_TRAIN_FACTOR
    return rate_s / COLOCATED_TRAIN_FACTOR if dedicated else rate_s


#: where ``moe_train_mfu`` (0.16) is read from: a Megatron pretraining run of Qwen3-30B-A3B on
#: 16 H800s (TP1 PP2 EP8, sequence length 8,192, 6,325 tokens/GPU/s), training on GPUs of its
#: own with no inference engine beside it: a dedicated rate, unlike ``train_mfu``, which the
#: colocated NeMo RL rows set
MOE_TRAIN_RATE_SOURCE = ("alibaba/Pai-Megatron-Patch", "issue #643", "2025-08-08")
