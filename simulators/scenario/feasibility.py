"""Layouts that are certain to fail, found before anything is scheduled.

The loader (``simulators/scenario/loader.py``) checks each field on its own; a scenario whose
fields are all fine can still be one the model cannot run: a pipeline whose own
training state does not fit its GPUs fails at init, whatever the scheduler does. Running
it costs a simulation and ends in an out-of-memory record that reads like a finding
about the modelled system. ``rlharness validate`` and ``simulate`` (through
:func:`simulators.scenario.loader.load_scenario`) apply these rules first and name the field.

The rules (docs/feasibility.md):

* ``single_controller_exclusive`` — a ``single_controller`` or ``disaggregated`` pipeline
  owns its training and inference GPUs for the whole run and never registers with the
  scheduler (NeMo RL's non-colocated controller; the disaggregated orders), so no other
  pipeline may list any of them: the other pipeline's first wake would meet the owner's
  resident weights and KV cache.
* ``init_fits`` — a pipeline's training GPUs hold its whole training state at init
  (parameters, gradients and optimizer moments: ``train_state_multiplier`` x weight
  bytes over its training GPUs, the communicator buffers when it trains on more than
  one GPU) plus its CUDA context.
* ``wake_fits`` — an inference GPU, when its rank first wakes, holds the pipeline's CUDA
  context plus ``max(weights / infer_tp, kv_cache_fraction x VRAM)`` (weights, then the
  KV cache fills the fraction) plus the TP group's buffers when ``infer_tp`` > 1; a
  single controller sizes its KV cache net of its context, so only context + weight
  shard must fit there.

Only the pipeline's own memory is counted: what other pipelines hold on a shared GPU
depends on the schedule, so a rule here never rejects a layout that could run. The
byte counts are the simulator's own allocations (``simulators/pipelines/ranks.py`` ``_Wake``,
``simulators/pipelines/training.py`` ``_train_bytes``, ``simulators/pipelines/single_controller.py``
``_setup``); ``tests/sim/test_feasibility.py`` runs each rejected layout through the
simulator to show the out-of-memory the rule predicts.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

from simulators.scenario.spec import CostSpec, PipelineSpec, Scenario

#: pipeline types that load their GPUs once for the run, outside the scheduler
#: (``simulators.pipelines.single_controller.hold_own_gpus``)
OWNS_ITS_GPUS = ("single_controller", "disaggregated")

#: (dotted field path, problem) — what the loader turns into one ScenarioError line
Problem = Tuple[str, str]


def _gib(nbytes: float) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB"


def _train_state_bytes(p: PipelineSpec, c: CostSpec) -> float:
    """Per-GPU training state at init: params + grads + optimizer, as the simulator
    allocates it (each kind rounded down, a negative remainder allocates nothing; a
    multiplier so large the bytes are no finite number is infinitely many)."""
    w, n = p.model.weight_bytes, len(p.train_gpus)
    mults = (1.0, c.optimizer_state_multiplier, c.train_state_multiplier - 1.0 - c.optimizer_state_multiplier)
    parts = [w * m / n for m in mults]
    return sum(max(0, int(x)) if x < float("inf") else x for x in parts)


def _exclusive(s: Scenario) -> Optional[Problem]:
    """The GPUs of a pipeline that owns them (:data:`OWNS_ITS_GPUS`) are no other
    pipeline's; the later of the two is named."""
    pipes = s.pipelines
    for j, q in enumerate(pipes):
        for i in range(j):
            p = pipes[i]
            if p.type not in OWNS_ITS_GPUS and q.type not in OWNS_ITS_GPUS:
                continue
            theirs = set(p.train_gpus) | set(p.infer_gpus)
            for key in ("train_gpus", "infer_gpus"):
                shared = sorted(set(getattr(q, key)) & theirs)
                if shared:
                    sc = p if p.type in OWNS_ITS_GPUS else q
                    return (
                        f"pipelines[{j}].{key}",
                        f"GPU(s) {shared} also belong to pipeline {p.name!r}; {sc.type} {sc.name!r} owns "
                        "its GPUs for the whole run and is not scheduled, so no other pipeline may use them "
                        "(rule: single_controller_exclusive)",
                    )
    return None


def _init(i: int, p: PipelineSpec, c: CostSpec, cap: int) -> Optional[Problem]:
    state = _train_state_bytes(p, c)
    nccl = c.nccl_buffer_bytes if len(p.train_gpus) > 1 and p.type not in OWNS_ITS_GPUS else 0
    need = c.cuda_context_bytes + state + nccl
    if need > cap:
        return (
            f"pipelines[{i}].model.params",
            f"the training state at init ({_gib(state)} per GPU: {c.train_state_multiplier:g} x "
            f"{_gib(p.model.weight_bytes)} of weights over {len(p.train_gpus)} training GPU(s))"
            + (f" + {_gib(nccl)} communicator buffers" if nccl else "")
            + f" + the {_gib(c.cuda_context_bytes)} CUDA context needs {_gib(need)} of a {_gib(cap)} GPU; "
            "give the pipeline more train_gpus or a smaller model (rule: init_fits)",
        )
    return None


def _wake(i: int, p: PipelineSpec, c: CostSpec, cap: int) -> Optional[Problem]:
    shard = p.model.weight_bytes // p.infer_tp
    ctx = c.cuda_context_bytes
    if p.type in OWNS_ITS_GPUS:
        fixed, kv_part = ctx + shard, 0
    else:
        fixed = ctx + shard + (c.nccl_buffer_bytes if p.infer_tp > 1 else 0)
        kv_part = ctx + max(shard, int(c.kv_cache_fraction * cap)) + (c.nccl_buffer_bytes if p.infer_tp > 1 else 0)
    if fixed > cap:
        return (
            f"pipelines[{i}].infer_tp",
            f"one inference shard ({_gib(p.model.weight_bytes)} of weights / infer_tp {p.infer_tp} = {_gib(shard)}) "
            f"+ the {_gib(ctx)} CUDA context"
            + (" + TP communicator buffers" if fixed > ctx + shard else "")
            + f" needs {_gib(fixed)} of a {_gib(cap)} GPU; raise infer_tp or use a smaller model (rule: wake_fits)",
        )
    if kv_part > cap:
        return (
            "costs.kv_cache_fraction",
            f"pipeline {p.name!r}: a woken inference rank takes kv_cache_fraction {c.kv_cache_fraction:g} x "
            f"{_gib(cap)} for weights + KV cache beside its {_gib(ctx)} CUDA context"
            + (" and TP communicator buffers" if p.infer_tp > 1 else "")
            + f": {_gib(kv_part)} of a {_gib(cap)} GPU; lower kv_cache_fraction (rule: wake_fits)",
        )
    return None


RULES: List[Callable[..., Optional[Problem]]] = [_init, _wake]


def infeasible(s: Scenario) -> Optional[Problem]:
    """The first rule ``s`` breaks, as (field, problem), or ``None`` when none does."""
    problem = _exclusive(s)
    if problem:
        return problem
    cap = s.cluster.vram_bytes
    for i, p in enumerate(s.pipelines):
        for rule in RULES:
            problem = rule(i, p, s.costs, cap)
            if problem:
                return problem
    return None


def static_headroom(s: Scenario) -> Optional[Tuple[int, int, str]]:
    """The least free memory any inference GPU keeps when a rank wakes on it, from the
    static memory plan (``rlharness validate``; the run's own figure is the summary's):
    capacity minus the CUDA context of every pipeline on the GPU, the largest wake there
    (``kv_cache_fraction`` x capacity or the weight shard, and TP buffers), the known
    residue (NeMo's init keeps a multi-GPU trainer's communicator buffers on its training
    GPUs: harness/logs/known_upstream.py) and the cache owner's sync bucket. (gpu, bytes, what)
    of the tightest GPU; None for a scenario without inference GPUs."""
    c, cap = s.costs, s.cluster.vram_bytes
    worst: Optional[Tuple[int, int, str]] = None
    gpus = sorted({g for p in s.pipelines for g in p.infer_gpus})
    for g in gpus:
        on = [p for p in s.pipelines if g in p.infer_gpus or g in p.train_gpus]
        ctx = c.cuda_context_bytes * len(on)
        wakes = [
            (c.nccl_buffer_bytes if p.infer_tp > 1 else 0)
            + max(p.model.weight_bytes // p.infer_tp, int(c.kv_cache_fraction * cap))
            if p.type != "single_controller"
            else p.model.weight_bytes // p.infer_tp
            for p in on
            if g in p.infer_gpus
        ]
        kept = [p.name for p in on if p.type == "nemo_async" and g in p.train_gpus and len(p.train_gpus) > 1]
        staging = (
            c.bucket_bytes if any(sorted(p.train_gpus)[0] == g for p in on if p.type != "single_controller") else 0
        )
        free = cap - ctx - max(wakes) - c.nccl_buffer_bytes * len(kept) - staging
        what = (
            f"GPU {g}: {len(on)} CUDA context(s), a wake of {_gib(max(wakes))}"
            + (
                f", the kept Megatron groups of {', '.join(kept)} ({_gib(c.nccl_buffer_bytes * len(kept))})"
                if kept
                else ""
            )
            + (f", a {_gib(staging)} sync bucket" if staging else "")
        )
        if worst is None or free < worst[1]:
            worst = (g, free, what)
    return worst
