"""The fault catalogue: every fault hook a scenario may name, and what each one breaks.

:class:`FaultSpec`'s docstring is the catalogue (the scenario reference lists its bullets);
``FAULT_NAMES`` are the names a scenario may give, ``ORACLE_FAULT_NAMES`` the subset that
exists to make the oracle's checks fire (``rlharness fuzz`` does not draw those).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FaultSpec:
    """A fault hook: ``name`` picks the fault, ``pipeline`` and ``at_step`` (0-based) where.

    * ``wake_before_offload`` — at that step the training state is not offloaded (the
      offload is "misordered" after the release): the next wake on those GPUs must OOM.
    * ``keep_nccl_on_sleep`` — from that step on, a sleeping TP>1 rank keeps its NCCL
      communicator buffers (RLix Bug 4): residue grows until the post-sleep check or an allocation fails.
    * ``skip_sync_on_expand`` — at that step an expand skips the weight sync: the woken
      level-2 rank holds no weights and its lifecycle refuses finalize/activation.
    * ``noop_progress_hooks`` — (whole run) the pipeline sends no progress reports, as the
      NeMo code's hooks do (docs/modelled-systems.md#rlix-progress-reports): demand reaches the scheduler only through
      GENERATION requests and their ``step_target_estimate``. Its ``fault_fired`` record
      stands at the first report withheld.
    * ``no_gen_watchdog`` — (whole run) no NeMo GENERATION re-request watchdog: after a
      preemption to zero nobody asks again (debug #32, "one-shot GENERATION"). Its
      ``fault_fired`` record stands where the watchdog would first have re-requested.
    * ``cache_after_offload`` — at that step the CPU bucket cache is built after training
      offloaded (debug #34/#35: the hook ran too late): the build finds parameters without
      storage and the pipeline crashes.
    * ``abort_never_wakes`` — from that step on, aborting a shrunk rank's in-flight requests
      never wakes their ``generate()`` (RLix Bug 7, vLLM 0.19): the drain never completes and
      the shrink times out.
    * ``lost_finish`` — (single_controller) at that step the driver's ``finish_train_step``
      never reaches the trainer, but the driver ticks its version and syncs anyway: the
      next ``begin_train_step`` finds the step still open (``streaming_step``).
    * ``stale_select_target`` — (single_controller, whole run) the train pump's waiting
      select keeps the size it was asked for when a drop shrinks its step's target (the
      in-order drop wedge): with in_order and data failures the pump parks on groups that
      can never come (check ``pump_parked``).
    * ``keep_gen_on_finish`` — (whole run) the finished pipeline neither releases its
      GENERATION ranks (``await_release``) nor unregisters: its allocation lives until
      shutdown (MILES B-13), and a peer that needs those GPUs can starve.


    Reproductions of user-reported failures (``simulators/faults/field.py``):

    * ``collector_dies`` — (NeMo RL #2899) from the batch of that step on, the trajectory
      collector is dead (it died at a dataset epoch end): nothing is generated, the
      trainer waits for a batch forever.
    * ``engines_crash_after_refit`` — (NeMo RL #3488) after the first expand (wake → sync
      → publish → activate) at or after that step every engine of the pipeline dies
      silently: nothing routable, in-flight requests gone, the trainer polls an empty buffer.
    * ``stuck_request`` — (NeMo RL #3238) the first request drawn at or after that step
      never finishes, wherever it is dispatched: a straggler that wedges a synchronous step.
    * ``offload_keeps_params`` — (NeMo RL #2775) the training offload of that step leaves
      the parameters on the training GPUs: the next wake there runs out of memory.
    * ``strand_sync_group`` — (NeMo RL #3591) from that step on, a weight sync's dynamic
      NCCL group is never destroyed when the next one is built: stranded communicators keep
      their buffers until an allocation fails.
    * ``no_gen_estimate`` — (whole run; RLix debug #27) GENERATION requests carry no
      ``step_target_estimate``; with ``noop_progress_hooks`` the planner sees no demand and
      the request blocks forever.
    * ``expand_sync_fails`` — at the first expand at or after that step the weight sync
      fails at a receiver: the woken ranks are left awake and unroutable (no rollback) and
      RLix fails fast.

    Faults for the oracle's checks (``simulators/faults/oracle.py``; not user reports):

    * ``sync_outside_expand`` — from that step on, an expand's weight sync writes every
      rank of the pipeline, not only the expanded ones (``sync_targets``).
    * ``bulk_in_driver_meta`` — (one_hop data plane) from that step on, the driver packs
      each shard's tensors into the metadata it hands a worker (``data_plane``).
    * ``stale_batch`` — from that step on, the trainer takes trajectories up to two steps
      older than ``max_trajectory_age_steps`` allows (``trajectory_age``).
    * ``no_host_ram_guard`` — from that step on, a CPU bucket cache build is charged to host
      RAM without the guard: a node can go above its RAM with no ``host_oom`` (``host_ram``).
    * ``unchecked_activation`` — at that step an expand skips the weight sync and the
      controller then finalizes and activates the woken ranks without asking their state:
      an engine that never loaded weights becomes routable (vLLM's level-2 wake without a
      reload; ``rank_lifecycle``).
    * ``sleep_residue_grows`` — (NeMo RL #2619) from that step on, every sleep of a rank
      leaves 32 MiB more on each of its GPUs than the one before: the residue after sleep
      grows per cycle (check ``cycle_trends``, series ``residue_bytes``).
    * ``staging_leak`` — (vLLM #51258) from that step on, a weight sync's staging buffer
      is not freed and the next sync allocates another (``cycle_trends``, ``ipc_bytes``).
    * ``refit_slows`` — from that step on, each weight sync takes 0.25 s longer than the
      one before (``cycle_trends``, ``refit_s``).
    * ``unclamped_base_stamp`` — (whole run) base-weight trajectories are stamped the
      ranks' -1 instead of the published 0 (the model's age-0 bug before its fix): with
      ``max_trajectory_age_steps: 0`` they are stale at step 0, evicted and regenerated
      forever (``livelock``).
    * ``lost_lock_handoff`` — from that step on, a release of the coordinator lock forgets
      the call queued for it: the lock is free and the waiter is never woken (``lost_wakeup``).
    * ``partial_reload`` — from that step on, an expand's weight sync carries only the
      first bucket of the model: a level-2 engine is activated with most of its weights
      never reloaded (vllm #29341, verl #3461; ``engine_weights``).
    * ``resume_before_kv_wake`` — (staged wake) at that step (once) the expand resumes the
      engines before waking their KV cache, which comes one wake later (vllm #44483;
      ``engine_resume``, ``kv_cache_asleep``).
    * ``kv_wake_before_weights`` — (staged wake) at that step (once) the KV cache is woken
      before the weights (``engine_resume``).
    * ``abort_on_pause`` — from that step on, a ``wait`` or ``keep`` pause aborts every
      request it should have let finish or kept (miles #2372; ``pause_lost_work``).
    * ``stamp_at_completion`` — from that step on, a finished request is stamped with the
      version its rank holds when it completes, not the one it was dispatched to
      (rllm #622; ``version_at_dispatch``).
    * ``active_sync_fails`` — at that step (a nemo_async pipeline) the active refresh's weight
      sync fails at a receiver, after the training offload: the run fails; with the scheduler
      option ``release_after_offload`` (RLix's MILES line) the training GPUs are released
      first (docs/rlix-variants.md).
    * ``lost_cache_handoff`` — from that step on, a release of the cache owner's lock forgets
      the call queued for it: the lock is free and the waiter is never woken (``lost_wakeup``).
    * ``double_onload`` — at that step the controller onloads the training state before
      training, whose own wake onloads it again: the second onload is refused as MILES'
      torch_memory_saver refuses it ("Cannot resume allocation that is not paused"; rlops/rlix
      ``rlix/pipeline/miles_pipeline.py`` at f73bfaf, ``_before_training``) and the run fails.
    * ``finalize_fails`` — at that step the active refresh's finalize fails on the serving
      ranks (``finalize_weight_update`` raises): the run fails; with ``finalize_pause:
      continue_after`` the ranks stay paused (rlops/rlix PR #14's bug; ``engine_stood_down``).
    * ``publish_on_ack`` — at that step (a nemo_async pipeline with serving ranks) the active
      refresh publishes the version on the sync's acknowledgement, before the receivers'
      finalize applies it (RLinf #1456; ``versions``).
    * ``lost_release_ack`` — from that step on, the commit of a cycle that shrinks the
      pipeline's GENERATION cluster for its planned release forgets the release: the
      cluster reaches zero and its ``await_release`` is never acked (``lost_wakeup``).
    * ``watchdog_request_under_lock`` — from that step on (a nemo_async pipeline), the
      GENERATION watchdog holds the pipeline's resize lock across its re-request, the order
      RLix's watchdog avoids: the expand that would grant it waits on the lock, the
      scheduler on the expand (``deadlock``; RLix's resize-lock deadline then fails the run).
    * ``requeue_ignores_partial_rollout`` — from that step on (disaggregated ``fully_async``, ``weight_sync: drain``) a
      sync requeues the running trajectories with their tokens (THUDM/slime #2092; ``version_span``).
    * ``staleness_capacity_reset`` — at that step (disaggregated ``fully_async``) the rollouter's count of started
      trajectories restarts at zero, as after a recovery (inclusionAI/AReaL #1388; ``version_span``).
    * ``weight_sync_off_thread`` — from that step on (disaggregated) the weight sync runs beside the trainer on its
      communicator (volcengine/verl #7423; ``collective_order``).
    * ``comm_locks_inverted`` — from that step on (disaggregated ``comm_locks``) the weight sync takes the EP
      communicator's lock before PP's, the trainer PP's before EP's: each holds one and waits for the other
      (volcengine/verl #7423's fix per communicator; ``collective_order``, ``deadlock``).
    * ``refit_without_pause`` — from that step on (``single_controller``) the refit writes the
      weights into generation that is still running: no ``PauseRollouts`` before it
      (NVIDIA-NeMo/RL #3839, vllm-project/vime #168; ``engine_transition``).
    * ``memo_not_invalidated`` — from that step on (``weights_memo``) a weight load leaves the engine's
      memo in place: after a level-2 sleep the finalize reads it stale (sgl-project/sglang PR #28676;
      ``engine_transition``).
    * ``critic_warmup_no_wake`` — from that step on (``single_controller``) a critic warm-up step stands generation
      down and skips the refit and the resume (NVIDIA-NeMo/RL #3730's review; ``engine_stood_down``).
    """

    name: str
    pipeline: str
    at_step: int = 0


FAULT_NAMES = (
    "wake_before_offload",
    "skip_sync_on_expand",
    "keep_nccl_on_sleep",
    "noop_progress_hooks",
    "no_gen_watchdog",
    "keep_gen_on_finish",
    "cache_after_offload",
    "abort_never_wakes",
    "collector_dies",
    "engines_crash_after_refit",
    "stuck_request",
    "offload_keeps_params",
    "strand_sync_group",
    "no_gen_estimate",
    "expand_sync_fails",
    "lost_finish",
    "stale_select_target",
)
# faults that exist to make the oracle's checks fire (simulators/faults/oracle.py): a scenario
# may name them; `rlharness fuzz` does not draw them (its draws stay what they were)
ORACLE_FAULT_NAMES = (
    "sync_outside_expand",
    "bulk_in_driver_meta",
    "stale_batch",
    "no_host_ram_guard",
    "unchecked_activation",
    "sleep_residue_grows",
    "staging_leak",
    "refit_slows",
    "unclamped_base_stamp",
    "lost_lock_handoff",
    "partial_reload",
    "resume_before_kv_wake",
    "kv_wake_before_weights",
    "abort_on_pause",
    "stamp_at_completion",
    "active_sync_fails",
    "lost_cache_handoff",
    "lost_release_ack",
    "watchdog_request_under_lock",
    "double_onload",
    "finalize_fails",
    "requeue_ignores_partial_rollout",
    "staleness_capacity_reset",
    "weight_sync_off_thread",
    "critic_warmup_no_wake",
    "publish_on_ack",
    "refit_without_pause",
    "memo_not_invalidated",
    "comm_locks_inverted",
)
FAULT_NAMES = FAULT_NAMES + ORACLE_FAULT_NAMES
