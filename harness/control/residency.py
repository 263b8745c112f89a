"""What a training cluster keeps on its GPUs in each phase, as the reference code does it.

One row per (pipeline type, phase): which kinds of memory the phase loads onto the
training GPUs (``params`` = model parameters, ``grads`` = gradient buffers and fp32 main
parameters — ROLL's ``other_params`` —, ``optimizer`` = Adam moments, ``nccl`` =
communicator buffers of the training process groups), which of them leave the GPU when
the phase ends, and whether the process groups are destroyed then. Both runtimes read this
table: the control logic (``roll_sync``, ``nemo_async``, ``init``) yields the offload and
group-destroy effects it prescribes, and the simulator charges the VRAM it lists; the
``handover`` check (harness/logs/invariants/handover.py) then finds, from the log alone, what a
phase left behind on a GPU that changed hands. ``docs/residency.md`` is generated from
:func:`residency_markdown` (a test keeps them equal).

A real configuration switch is a scenario switch with the real default
(:class:`TrainerSwitches`). Sources: RLix ``nemo`` branch f77d913, ROLL (alibaba/ROLL
8eb27cc; the fork RLix pins, rlops/ROLL af54f36, could not be read), NeMo RL fork
(TianyeGGBond/RL 0775e9c).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

KINDS = ("params", "grads", "optimizer", "nccl")
PHASES = ("init", "old_log_probs", "train", "cache_build", "active_refresh", "offload")


@dataclass(frozen=True)
class TrainerSwitches:
    """Real configuration switches that change residency; defaults are what RLix runs."""

    # ROLL ``batch.meta_info["is_offload_states"]`` for the OLD_LOG_PROBS compute: RLix's
    # full-finetune pipeline sets False (Phase 12), so the parameters and the process
    # groups stay on the GPUs across ``release_then_request`` (the fix sets True).
    old_log_probs_offload_states: bool = False
    # ROLL ``offload_nccl`` (worker config; RLix's coordinator forces True on every GPU
    # cluster): groups are reloaded when states load and destroyed when they offload.
    offload_nccl: bool = True


@dataclass(frozen=True)
class PhaseResidency:
    phase: str
    loads: Tuple[str, ...]  # kinds this phase brings onto the training GPUs
    offloaded_at_end: Tuple[str, ...]  # kinds that leave the GPUs when the phase ends
    destroys_groups: bool  # process groups (and their buffers) destroyed at the end
    source: str


_ROLL_SRC = "rlix f77d913 rlix/pipeline/full_finetune_pipeline.py"
_NEMO_SRC = "rlix f77d913 rlix/pipeline/nemo_rl_pipeline.py"


def roll_residency(sw: TrainerSwitches = TrainerSwitches()) -> Dict[str, PhaseResidency]:
    """RLix ``RollFullFinetunePipeline`` (non-GAE) on ROLL's Megatron actor worker."""
    nccl = ("nccl",) if sw.offload_nccl else ()
    olp_off = ("params",) if sw.old_log_probs_offload_states else ()
    return {
        p.phase: p
        for p in (
            PhaseResidency(
                "init",
                ("params", "grads", "optimizer", "nccl"),
                ("params", "grads", "optimizer"),
                sw.offload_nccl,
                f"{_ROLL_SRC} initialize_pipeline: INITIALIZATION actor_train, initialize + load_states, "
                "build/promote cache v-1, offload_states, release; groups destroyed on offload per "
                "rlix/pipeline/coordinator.py _validate_offload_nccl (offload_nccl forced True)",
            ),
            PhaseResidency(
                "old_log_probs",
                ("params",) + nccl,
                olp_off,
                sw.old_log_probs_offload_states and sw.offload_nccl,
                f"{_ROLL_SRC} run() Phase 13/12: request OLD_LOG_PROBS, is_offload_states=False; "
                "ROLL roll/pipeline/base_worker.py compute_log_probs load_kwargs include=[model_params]; "
                "roll/utils/context_managers.py state_offload_manger: reload_process_groups if offload_nccl, "
                "offload + destroy_process_groups only if is_offload_states; then Phase 16 "
                "release_then_request(actor_train -> actor_train, ACTOR_TRAINING)",
            ),
            PhaseResidency(
                "train",
                ("params", "grads", "optimizer") + nccl,
                ("optimizer",),
                False,
                "ROLL roll/pipeline/base_worker.py train_step load_kwargs include=[model_params, other_params] "
                "(is_offload_states still False on the batch); roll/distributed/strategy/megatron_strategy.py "
                "train_step loads optimizer_states for optimizer.step and offloads them after "
                "(is_offload_optimizer_states_in_train_step default True)",
            ),
            PhaseResidency(
                "cache_build",
                (),
                (),
                False,
                f"{_ROLL_SRC} run() Phase 16: build_latest_bucket_cache + promote while parameters are on the GPU",
            ),
            PhaseResidency(
                "active_refresh",
                (),
                (),
                False,
                f"{_ROLL_SRC} run(): sync_base_weights_to_active after offload; every GEN rank was shrunk "
                "to zero at step start (await_release), so nothing is refreshed",
            ),
            PhaseResidency(
                "offload",
                (),
                ("params", "grads", "optimizer"),
                sw.offload_nccl,
                f"{_ROLL_SRC} run() Phase 16: actor_train.offload_states(blocking=True) before the active "
                "sync and the release; groups destroyed per coordinator.py _validate_offload_nccl",
            ),
        )
    }


def nemo_residency(sw: TrainerSwitches = TrainerSwitches()) -> Dict[str, PhaseResidency]:
    """RLix ``NemoRLFullFinetunePipeline`` on NeMo RL's Megatron policy worker."""
    return {
        p.phase: p
        for p in (
            PhaseResidency(
                "init",
                ("params", "grads", "optimizer", "nccl"),
                ("params", "grads", "optimizer"),
                False,
                f"{_NEMO_SRC} initialize_pipeline Phase 1: INITIALIZATION actor_train, init workers, "
                "bootstrap cache v-1, _offload_training_gpu (offload_after_refit), release; the pp_group "
                "is kept alive (debug #24: destroying it breaks step-0 get_logprobs)",
            ),
            PhaseResidency(
                "old_log_probs",
                (),
                (),
                False,
                "NeMo RL computes log-probs inside the ACTOR_TRAINING allocation (no separate request)",
            ),
            PhaseResidency(
                "train",
                ("params", "grads", "optimizer", "nccl"),
                (),
                False,
                f"{_NEMO_SRC} before_training: request ACTOR_TRAINING, reload Megatron NCCL groups from "
                "their snapshot, log-probs + train with the whole training state resident (docs/modelled-systems.md#rlix-pipeline-steps)",
            ),
            PhaseResidency(
                "cache_build",
                (),
                (),
                False,
                f"{_NEMO_SRC} before_weight_sync: CPU bucket cache built while parameters are still on "
                "the GPU (debug #34/#35)",
            ),
            PhaseResidency(
                "offload",
                (),
                ("params", "grads", "optimizer"),
                True,
                f"{_NEMO_SRC} (F11) grpo.py weight_sync block: policy.offload_after_refit() then "
                "destroy_megatron_nccl_groups() before after_training",
            ),
            PhaseResidency(
                "active_refresh",
                (),
                (),
                False,
                f"{_NEMO_SRC} after_training: sync_base_weights_to_active under the coordinator lock, "
                "publish, then notify_release_gpus(actor_train): the trainer holds nothing by then",
            ),
        )
    }


def residency(kind: str, sw: TrainerSwitches = TrainerSwitches()) -> Dict[str, PhaseResidency]:
    return roll_residency(sw) if kind == "roll_sync" else nemo_residency(sw)


def residency_markdown() -> str:
    """The residency table of docs/residency.md (default switches)."""
    lines: List[str] = []
    for kind, title in (
        ("roll_sync", "ROLL full finetune under RLix (`roll_sync`)"),
        ("nemo_async", "NeMo RL async GRPO under RLix (`nemo_async`)"),
    ):
        lines += [
            f"### {title}",
            "",
            "| phase | loads | offloaded at the end | groups destroyed | source |",
            "|---|---|---|---|---|",
        ]
        rows = residency(kind)
        for phase in PHASES:
            row = rows[phase]
            lines.append(
                f"| {phase} | {', '.join(row.loads) or '—'} | {', '.join(row.offloaded_at_end) or '—'} | "
                f"{'yes' if row.destroys_groups else 'no'} | {row.source} |"
            )
        lines.append("")
    return "\n".join(lines)
