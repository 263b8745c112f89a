"""The static memory plan per phase, and the known upstream behaviours a scenario is
exposed to, for ``rlharness preflight`` (docs/preflight.md).

Both read only the scenario: no schedule, no run. The byte counts are the simulator's own
allocations, as ``simulators/scenario/feasibility.py`` counts them (its ``init_fits`` and
``wake_fits`` rules are the training and generation rows here, without another pipeline's
memory: what shares a GPU across pipelines depends on the schedule): one CUDA context per
pipeline and GPU, the training state while training, weights and KV cache while generating,
and during a refit one staged sync bucket beside the live KV cache (the simulator reuses one
staging buffer bucket after bucket). ``tests/unit/test_preflight.py`` compares them with the
peaks a simulated run's allocations reach.

:func:`phase_peaks` and :func:`known_behaviours` are deliberately small and self-contained:
where the project's summaries gain a memory-headroom figure and a known-behaviour list of
their own, these are the two functions to point at them.
"""

from __future__ import annotations

from typing import List, NamedTuple

from simulators.scenario.feasibility import _train_state_bytes
from simulators.scenario.spec import CostSpec, PipelineSpec, Scenario


class PhasePeak(NamedTuple):
    pipeline: str
    phase: str  # training | generation | refit
    peak_bytes: int  # on the pipeline's most loaded GPU in that phase
    capacity_bytes: int
    field: str  # the scenario field that changes it most directly
    parts: str  # what the peak is made of
    fix: str = ""  # the value of ``field`` that would fit, when it does not

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.peak_bytes


class Behaviour(NamedTuple):
    name: str  # where it is documented upstream
    pipeline: str
    figure: str
    field: str


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _costs(s: Scenario, p: PipelineSpec) -> CostSpec:
    return p.costs if p.costs is not None else s.costs


def _inference_bytes(p: PipelineSpec, c: CostSpec, cap: int) -> int:
    """A woken rank's weights and KV cache (vLLM fills kv_cache_fraction of the GPU, at least the shard)."""
    shard = p.model.weight_bytes // p.infer_tp
    if p.type == "single_controller":
        return max(shard, int(c.kv_cache_fraction * cap) - c.cuda_context_bytes)
    return max(shard, int(c.kv_cache_fraction * cap))


def _pipeline_peaks(s: Scenario, i: int, p: PipelineSpec) -> List[PhasePeak]:
    c, cap = _costs(s, p), s.cluster.vram_bytes
    ctx, state = c.cuda_context_bytes, _train_state_bytes(p, c)
    train_nccl = c.nccl_buffer_bytes if len(p.train_gpus) > 1 and p.type != "single_controller" else 0
    tp_nccl = c.nccl_buffer_bytes if p.infer_tp > 1 and p.type != "single_controller" else 0
    kept = tp_nccl if not p.offload_nccl and set(p.train_gpus) & set(p.infer_gpus) else 0
    infer, shard = _inference_bytes(p, c, cap), p.model.weight_bytes // p.infer_tp
    at = f"pipelines[{i}]"
    train = PhasePeak(
        p.name,
        "training",
        ctx + state + train_nccl + kept,
        cap,
        f"{at}.train_gpus",
        f"training state {_gib(state)} ({c.train_state_multiplier:g} x weights over {len(p.train_gpus)} GPUs)"
        + (f" + communicators {_gib(train_nccl)}" if train_nccl else "")
        + f" + context {_gib(ctx)}"
        + (f" + a sleeping rank's TP communicators (offload_nccl false) {_gib(kept)}" if kept else ""),
    )
    gen = PhasePeak(
        p.name,
        "generation",
        ctx + infer + tp_nccl,
        cap,
        f"{at}.infer_tp" if infer == shard else f"{at}.costs.kv_cache_fraction",
        f"weights + KV cache {_gib(infer)} (kv_cache_fraction {c.kv_cache_fraction:g}, weight shard "
        f"{_gib(shard)})" + (f" + TP communicators {_gib(tp_nccl)}" if tp_nccl else "") + f" + context {_gib(ctx)}",
    )
    staging = min(c.bucket_bytes, p.model.weight_bytes)
    refit = PhasePeak(
        p.name,
        "refit",
        gen.peak_bytes + staging,
        cap,
        f"{at}.costs.bucket_bytes",
        f"the generation peak + one staged sync bucket {_gib(staging)} beside the live KV cache",
    )
    peaks = [train, gen, refit] if p.type != "single_controller" else [train, gen]
    return [pk._replace(fix=_fix(pk, p, c, cap)) if pk.peak_bytes > cap else pk for pk in peaks]


def _fix(peak: PhasePeak, p: PipelineSpec, c: CostSpec, cap: int) -> str:
    """What would fit: training GPUs, inference TP / KV fraction, bucket size."""
    over = peak.peak_bytes - cap
    if peak.phase == "training":
        state = _train_state_bytes(p, c) * len(p.train_gpus)
        room = cap - (peak.peak_bytes - _train_state_bytes(p, c))
        return (
            f"at least {-(-state // room)} training GPUs" if room > 0 else "nothing: the fixed part alone does not fit"
        )
    if peak.phase == "generation":
        if peak.field.endswith("infer_tp"):
            room = cap - (peak.peak_bytes - p.model.weight_bytes // p.infer_tp)
            return f"infer_tp of at least {-(-p.model.weight_bytes // room)}" if room > 0 else "nothing"
        return f"kv_cache_fraction at most {(c.kv_cache_fraction * cap - over) / cap:.2f}"
    return f"bucket_bytes at most {_gib(min(c.bucket_bytes, p.model.weight_bytes) - over)}"


def phase_peaks(s: Scenario) -> List[PhasePeak]:
    """Each pipeline's per-GPU peak in each phase, from the static memory plan."""
    return [peak for i, p in enumerate(s.pipelines) for peak in _pipeline_peaks(s, i, p)]


def known_behaviours(s: Scenario) -> List[Behaviour]:
    """Upstream behaviours (bugs and limits reported upstream, docs/modelled-systems.md)
    whose preconditions the scenario's settings meet."""
    out: List[Behaviour] = []
    cap = s.cluster.vram_bytes
    for i, p in enumerate(s.pipelines):
        c = _costs(s, p)
        at = f"pipelines[{i}]"
        if p.infer_tp > 1 and not p.offload_nccl and p.sleep_level == 2:
            out.append(
                Behaviour(
                    "RLix Bug 4: a sleeping TP>1 rank keeps its NCCL buffers",
                    p.name,
                    f"{_gib(c.nccl_buffer_bytes)} per sleeping rank stay on the GPU",
                    f"{at}.offload_nccl",
                )
            )
        if p.refit_path == "cpu_cache" and c.bucket_bytes >= p.model.weight_bytes // p.infer_tp:
            gen = _inference_bytes(p, c, cap) + c.cuda_context_bytes
            if gen + p.model.weight_bytes // p.infer_tp > cap:
                out.append(
                    Behaviour(
                        "RLix Bug 5: a whole-model sync bucket next to a live KV cache runs out of memory",
                        p.name,
                        f"bucket {_gib(c.bucket_bytes)} >= weight shard; {_gib(gen)} already held",
                        f"{at}.costs.bucket_bytes",
                    )
                )
        if p.sleep_level == 1:
            ranks_per_node = max(1, s.cluster.gpus_per_node // p.infer_tp)
            host = ranks_per_node * p.model.weight_bytes // p.infer_tp
            if host > s.cluster.host_ram_bytes:
                out.append(
                    Behaviour(
                        "vLLM sleep level 1 keeps every sleeping rank's weights in host RAM",
                        p.name,
                        f"{_gib(host)} per node over {_gib(s.cluster.host_ram_bytes)} of host RAM",
                        f"{at}.sleep_level",
                    )
                )
        if p.type == "single_controller" and p.streaming is not None and p.streaming.sampler == "in_order":
            out.append(
                Behaviour(
                    "NeMo RL #3238/#3666: under in_order a rollout that never returns wedges its step",
                    p.name,
                    f"stall watchdog after {p.streaming.stall_timeout_s:g} s "
                    f"({p.streaming.stall_action}); no rollout deadline",
                    f"{at}.streaming.sampler",
                )
            )
        if p.type == "roll_sync" and not p.old_log_probs_offload_states:
            others = sorted({g for j, q in enumerate(s.pipelines) if j != i for g in q.infer_gpus} & set(p.train_gpus))
            if others:
                out.append(
                    Behaviour(
                        "RLix: OLD_LOG_PROBS keeps its parameters across release_then_request "
                        "(is_offload_states False), another pipeline may wake on them",
                        p.name,
                        f"training GPUs {others} are other pipelines' inference GPUs",
                        f"{at}.old_log_probs_offload_states",
                    )
                )
    return out
