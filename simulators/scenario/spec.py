"""Scenario data model: what a simulation run is made of, with units on every number.

A scenario file (YAML, see ``simulators/scenario/loader.py`` for loading and validation)
becomes one :class:`Scenario`. Every cost parameter has a documented unit and a default
taken from the upstream measurements where one exists (docs/modelled-systems.md#rlix-timeouts-and-measured-durations);
``rlharness calibrate`` and the cost model (docs/cost-model.md) fit or derive them. Sizes are bytes,
bandwidths bytes/second, times seconds, throughputs tokens/second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from simulators.pipelines.dataplane import DataPlaneSpec  # noqa: F401  (re-exported: a pipeline section)
from simulators.scenario.fault_catalogue import FAULT_NAMES, ORACLE_FAULT_NAMES, FaultSpec  # noqa: F401  (re-exported)

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 1
    gpus_per_node: int = 2
    vram_bytes: int = 80 * GiB  # per GPU
    host_ram_bytes: int = 1024 * GiB  # per node
    pcie_bytes_per_s: float = 25e9  # per GPU, each direction (H2D, D2H)
    intra_node_bytes_per_s: float = 150e9  # GPU-GPU inside a node (NVLink-class)
    inter_node_bytes_per_s: float = 25e9  # per node NIC
    # A GPU preset (simulators/costmodel/hardware.py: h100_sxm, h200, a100_80gb, h20, h800,
    # b200, l40s): sets vram_bytes and the three links where the file gives none, and with a
    # model's architecture lets the cost model derive each pipeline's costs; "" = none
    gpu: str = ""

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class ModelSpec:
    params: float = 0.5e9  # parameter count
    bytes_per_param: int = 2  # bf16 weights
    # A model preset (simulators/costmodel/models.py) fills params and the architecture
    # below where the file gives none; "" = none. The architecture (0 = not given) is what
    # the cost model needs (docs/cost-model.md): without it the explicit costs apply.
    preset: str = ""
    active_params: float = 0.0  # parameters active per token (a mixture of experts); 0 = params
    layers: int = 0
    hidden_size: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    vocab_size: int = 0
    experts_per_token: int = 0  # routed experts per token (top-k) of a mixture of experts; 0 = dense
    num_experts: int = 0  # routed experts per MoE layer (config.json's num_experts); 0 = dense or not given

    @property
    def weight_bytes(self) -> int:
        return int(self.params * self.bytes_per_param)


@dataclass(frozen=True)
class WorkloadSpec:
    prompts_per_step: int = 4  # prompt groups per training step
    generations_per_prompt: int = 2
    decode_tokens_median: float = 512.0  # tokens; decode lengths are log-normal around this
    decode_tokens_sigma: float = 0.8  # log-space sigma: the long tail
    decode_tokens_max: int = 8192
    # share of answers that run to decode_tokens_max (a run's clip ratio: verl's
    # response_length/clip_ratio, TRL's completions/clipped_ratio, NeMo RL's truncation rate):
    # the draws above the log-normal's (1 - share) quantile take the cap; 0 = the log-normal cut at the cap
    decode_tokens_cap_share: float = 0.0
    max_trajectory_age_steps: int = 1  # async GRPO staleness window
    max_concurrent_per_rank: int = 64  # batching limit of one DP rank
    tokens_per_s_per_rank: float = 2400.0  # aggregate decode throughput of a full rank (per TP bundle)
    batching_half_point: float = 8.0  # concurrency at which a rank reaches half its aggregate throughput
    prompt_tokens: int = 256  # prompt length: with the decode length, the tokens the cost model trains on
    # How a rank's decode time is charged (simulators/pipelines/inference.py): "at_start" fixes a request's
    # duration when it starts, at the concurrency it finds; "per_step" charges every decode step
    # at the concurrency of that step (continuous batching), so the last sequences of a batch
    # decode at the low-batch step time. The cost model derives "per_step" with its curve.
    decode_timing: str = "at_start"
    # per_step only: seconds of a full-concurrency step spent reading the routed experts' weights
    # (a mixture of experts); a step with c sequences reads the share 1 - (1 - k/E)^c of them
    decode_expert_read_s: float = 0.0
    # per_step only: seconds a decode step spends reading one cached token of a running
    # sequence (its KV cache); the curve above charges every sequence the mean context
    # (prompt + half the mean answer), this charges each running sequence its own
    decode_kv_s_per_token: float = 0.0

    @property
    def trajectories_per_step(self) -> int:
        return self.prompts_per_step * self.generations_per_prompt


@dataclass(frozen=True)
class CostSpec:
    """Durations and sizes of the non-generation work (seconds unless stated)."""

    train_s_per_trajectory: float = 0.5  # forward+backward per trajectory on the training cluster
    train_fixed_s: float = 2.0
    old_log_probs_s_per_trajectory: float = 0.1
    offload_bytes_per_s: float = 20e9  # training state GPU -> host
    # Training state while training, x weight bytes: parameters (1x) + gradient buffers and
    # fp32 main parameters (ROLL's "other_params": the rest) + Adam moments (below); which
    # of them a phase loads is harness/control/residency.py (docs/residency.md)
    train_state_multiplier: float = 8.0
    optimizer_state_multiplier: float = 4.0  # Adam's two fp32 moments: 8 B per bf16 parameter (2 B)
    nccl_group_create_s: float = 1.5  # one dynamic or training NCCL group (docs/modelled-systems.md#rlix-timeouts-and-measured-durations: ~1-2 s)
    nccl_group_destroy_s: float = 0.05
    nccl_buffer_bytes: int = 512 * MiB  # communicator buffers resident per group member
    wake_s: float = 0.8  # vLLM wake_up (docs/modelled-systems.md#rlix-timeouts-and-measured-durations: 0.7-0.9 s)
    sleep_s: float = 0.3
    drain_s: float = 0.2  # abort + drain of in-flight requests
    finalize_s: float = 0.5  # receiver process_weights_after_loading
    cache_pack_bytes_per_s: float = 8e9  # building the CPU bucket cache (D2H + pack)
    bucket_bytes: int = 256 * MiB  # explicit bucket size (TASK2 default 256 MiB)
    receiver_load_bytes_per_s: float = 40e9  # receiver copies a staged bucket into weights
    # The refit stream's remaining costs (harness/refit/stream.py; fitted by `rlharness calibrate refit`):
    refit_pack_bytes_per_s: float = 0.0  # sender packs a group into its staging buffer; 0 = the PCIe H2D link
    refit_group_overhead_s: float = 0.0  # per data group: message + ACK round trip
    refit_tensor_overhead_s: float = 0.0  # per tensor, on each side (a copy call, a view)
    refit_setup_s: float = 0.0  # per sync: take the two staging buffers (from the allocator's cache)
    refit_staging_bytes_per_s: float = 0.0  # allocate + first-touch an oversized tensor's fresh buffer; 0 = free
    refit_complete_s: float = 0.0  # release the buffers, COMPLETE and its ACK
    # colocated_ipc only: seconds per sync each GPU spends gathering the training shards into
    # whole tensors before the hand-over (TP all-gather, PP broadcast, EP all-gather);
    # derived by the cost model (refit_formulas.refit_gather_s), 0 = not modelled
    refit_gather_s: float = 0.0
    # vLLM gpu_memory_utilization: share of a GPU a woken rank takes for weights + KV cache
    kv_cache_fraction: float = 0.9
    cuda_context_bytes: int = 500 * MiB  # residue per process on a GPU
    # The cost model's efficiency factors (used only where cluster.gpu and a model
    # architecture are given; docs/cost-model.md says how they were chosen):
    train_mfu: float = 0.35  # model-FLOPs utilization of training and log-prob passes
    decode_flops_efficiency: float = 0.5  # share of peak FLOP/s a decode step's matmuls reach
    hbm_efficiency: float = 0.8  # share of the HBM bandwidth weight and KV reads reach
    moe_train_mfu: float = 0.16  # the same for a mixture of experts (model.experts_per_token > 0)
    # share of peak FLOP/s a decode step's routed-expert matmuls reach (measured in vLLM:
    # simulators/costmodel/moe.py); the rest of a mixture of experts decodes at decode_flops_efficiency
    moe_decode_flops_efficiency: float = 0.04
    link_efficiency: float = 1.0  # share of a preset's NVLink / NIC figure training's collectives reach
    tp_allreduce_latency_s: float = 10e-6  # fixed part of one tensor-parallel all-reduce
    # host work of one decode step the GPU waits for (scheduling, input preparation, output
    # processing): vllm-project/vllm#6854 profiles ~4 ms of GPU idle per decode step
    decode_step_overhead_s: float = 0.004
    max_num_seqs: int = 256  # the engine's cap on concurrent sequences (vLLM's default)
    wake_fixed_s: float = 0.5  # wake_up's fixed part (allocator, CUDA graphs)
    sleep_fixed_s: float = 0.2
    post_sleep_residue_bytes: int = 256 * MiB  # what a sleeping rank keeps (threshold check: < 1 GiB)
    post_sleep_threshold_bytes: int = 1 * GiB
    # least free memory a wake must keep beside a residue another cluster left on a GPU it
    # was handed (the handover_headroom check; docs/residency.md)
    handover_margin_bytes: int = 1 * GiB
    # how long a pipeline may wait for its batch with no routable rank while a whole bundle of
    # its inference mapping idles (idle_bundle_starvation); 0 = derived from the scenario's
    # own timescales (polls, watchdog, a wake and a sync: simulators/runtime/timeouts.py)
    idle_bundle_bound_s: float = 0.0
    # seconds from an engine's sleep returning to its memory leaving the VRAM ledger: SGLang's
    # release_memory_occupation answers 200 before the driver has the memory back (THUDM/slime
    # #579; radixark/miles #86: 29.39 GB still used); 0 = freed at the return (vLLM's sleep)
    release_to_freed_s: float = 0.0
    # the MILES wait after the training grant (pipeline option wait_offloaded; rlops/rlix PR #11,
    # f73bfaf): each phase's timeout (timeout_s=60) and the largest residue it waits for
    # (MILES_MAX_RESIDUAL_GPU_MEM_GB = 10; nvidia-smi's MiB / 1024)
    offload_wait_timeout_s: float = 60.0
    max_residual_gpu_mem_bytes: int = 10 * GiB
    watchdog_s: float = 2.0  # NeMo GEN re-request watchdog period
    scheduler_poll_s: float = 1.0  # RLix central loop poll (background rebalance)
    # RLix's timeouts; each expiry is a fail-fast shutdown of the run (simulators/runtime/timeouts.py)
    await_release_timeout_s: float = 300.0  # RLIX_NOTIFY_READY_TIMEOUT_S: planned shrink-to-zero
    resize_lock_timeout_s: float = 180.0  # RLIX_RESIZE_LOCK_TIMEOUT_S: coordinator lock acquire
    selective_sync_timeout_s: float = 150.0  # ROLL_SELECTIVE_MODEL_UPDATE_TIMEOUT_S: one weight sync
    # rebalance_on_shrink: aborted requests draining out of a rank; 0 = no deadline (an
    # unbounded pause: NeMo RL's refit_timeout_s: null, NVIDIA-NeMo/RL #3929)
    shrink_drain_timeout_s: float = 30.0


@dataclass(frozen=True)
class DisaggregatedSpec:
    """A ``disaggregated`` pipeline's order (``harness/control/disaggregated.py``): ``sync``,
    ``one_step_off`` or ``fully_async``; and, fully asynchronous, what the generation does
    during a weight sync: ``drain``, ``pause`` (a partial rollout) or ``in_flight``. The
    staleness bound of ``fully_async`` is ``workload.max_trajectory_age_steps``."""

    shape: str = "sync"  # the order: NeMo RL's synchronous, verl's one step off, or fully asynchronous
    # fully_async: drain the running answers, pause them (partial rollout), or sync under them
    weight_sync: str = "pause"
    # fully_async: the trainer's batch is the oldest completed trajectories (verl's message queue)
    # or the prompt groups generated for its step (target: NeMo RL's replay buffer)
    batching: str = "completion"
    # one_step_off: the sync beside the next step, PP and EP behind a lock each (simulators/pipelines/comm_locks.py)
    comm_locks: bool = False


@dataclass(frozen=True)
class StreamingSpec:
    """The single controller's ``async_rl`` knobs (``type: single_controller`` only;
    docs/modelled-systems.md#nemo-rl-streaming-single-controller). ``min_groups_for_streaming_train`` = ``prompts_per_step``
    is the non-streaming controller: the trainer waits for a whole batch."""

    sampler: str = "in_order"  # in_order | weight_fifo | windowed | ready_first | custom
    window: int = 1  # staleness window / lookahead, in versions
    freshest_first: int = 0  # windowed: 1 = newest start version first
    custom_target: str = ""  # "module:Class" when sampler is custom
    min_groups_for_streaming_train: int = 1
    max_inflight_prompts: int = 32
    max_buffered_rollouts: int = 64
    microbatch_groups: int = 1  # prompt groups per train_microbatch
    infra_failure_rate: float = 0.0  # chance one rollout attempt fails for an infrastructure reason
    data_failure_rate: float = 0.0  # chance one rollout attempt fails for a data reason
    max_infra_attempts_per_prompt: int = 3
    max_data_attempts_per_prompt: int = 2
    train_s_per_microbatch: float = 0.1  # fixed cost of one train_microbatch call (launch, no_sync bookkeeping)
    watchdog_interval_s: float = 30.0
    stall_timeout_s: float = 600.0
    stall_action: str = "warn"  # warn | abort
    # NeMo RL's drop budgets (harness/streaming/controller.py); off: drops are unlimited
    drop_budgets: bool = False
    max_skipped_prompts: int = 0
    max_consecutive_dropped_prompts: int = 0
    min_step_batch_fraction: float = 0.9
    # NeMo RL's rollout_failure.on_dropped_prompt (harness/streaming/controller.py)
    on_dropped_prompt: str = "shrink"  # shrink | replace
    max_replacement_attempts: int = 1
    replacement_reserve_prompts: int = 1
    # checkpoint the rollout buffer after this many finished steps, lose the process and
    # resume from the checkpoint (harness/streaming/checkpoint.py); 0 = never
    checkpoint_restore_after_steps: int = 0


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    type: str  # "nemo_async" | "roll_sync" | "single_controller" | "disaggregated"
    train_gpus: Tuple[int, ...]
    infer_gpus: Tuple[int, ...]
    infer_tp: int = 1
    # training layout (the cost model's input only; docs/cost-model.md): Megatron's TP, PP,
    # CP and EP sizes over train_gpus (DP = the rest), sequences per microbatch and per
    # optimizer step (0 = the step's whole batch in one optimizer step)
    train_tp: int = 1
    train_pp: int = 1
    train_cp: int = 1
    train_ep: int = 1
    train_micro_batch: int = 1
    train_global_batch: int = 0
    # sequence packing (NeMo RL's Megatron path): tokens a packed microbatch of the training
    # pass and of the log-prob pass holds (policy.sequence_packing.train_mb_tokens /
    # logprob_mb_tokens); 0 = not packed (simulators/costmodel/packing.py)
    train_pack_tokens: int = 0
    log_prob_pack_tokens: int = 0
    # forward passes of the log-prob stage: 2 where a reference policy's log-probs are
    # computed beside the policy's (NeMo RL's GRPO with reference_policy_kl_penalty > 0); 0 where
    # the trainer takes the log-probs the rollout engine returned (verl's rollout.calculate_log_probs)
    log_prob_passes: int = 1
    # full activation recomputation in training: each layer's forward rerun in the backward
    # (a NeMo RL recipe's megatron_cfg.activation_checkpointing), one more forward's work
    train_recompute: bool = False
    # the training backend: megatron (the layout above) or fsdp2 (verl's FSDP2: every training GPU
    # one shard; simulators/costmodel/fsdp2.py), and fsdp2's Ulysses sequence parallelism
    train_backend: str = "megatron"
    train_sp: int = 1
    model: ModelSpec = field(default_factory=ModelSpec)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    steps: int = 4
    sleep_level: int = 2
    start_s: float = 0.0  # when the pipeline registers
    streaming: StreamingSpec = field(default_factory=StreamingSpec)  # single_controller only
    data_plane: Optional[DataPlaneSpec] = None  # bulk through a store (simulators/pipelines/dataplane.py)
    # this pipeline's costs: the scenario's costs with the pipeline's own `costs:` section
    # and the cost model's derived values (docs/cost-model.md); None = the scenario's
    costs: Optional["CostSpec"] = None
    # ROLL switches (harness/control/residency.py, docs/residency.md); defaults are RLix's:
    # is_offload_states of the OLD_LOG_PROBS compute (RLix sets False: parameters and
    # process groups stay across release_then_request; True is the fix)
    old_log_probs_offload_states: bool = False
    offload_nccl: bool = True  # groups reloaded on load, destroyed on offload (RLix forces True)
    # the engine's pause mode and wake order (harness/control/engine.py, docs/engine-lifecycle.md);
    # defaults are RLix's: sleep_partial(mode="abort"), one wake of every tag
    pause_mode: str = "abort"
    wake: str = "all"
    # RLix's MILES wait after the training grant until the engines' memory is back (rlops/rlix
    # PR #11; docs/engine-lifecycle.md); off by default, as on RLix's nemo branch
    wait_offloaded: bool = False
    # RLix's MILES pause of the serving ranks around the active refresh's finalize (rlops/rlix
    # rlix/pipeline/miles_model_update_service.py): none (RLix nemo), continue_after (before
    # PR #14), continue_finally (PR #14: continue_generation in a finally)
    finalize_pause: str = "none"
    # the engine keeps a memo in its weights' region, read by the post-load processing at each
    # finalize and dropped at each load (SGLang's MXFP8 MoE shuffle indices, sgl-project/sglang PR #28676)
    weights_memo: bool = False
    # how a refit reaches the inference ranks (simulators/refit/sync.py, docs/cost-model.md):
    # cpu_cache = RLix's, a host-RAM bucket cache built after training, then synced from it;
    # colocated_ipc = standalone NeMo RL's, each trainer GPU hands its weights to the vLLM
    # worker on the same GPU by CUDA IPC, group by group (no host-RAM cache)
    refit_path: str = "cpu_cache"
    # how NeMo RL's Megatron refit gathers each tensor whole (colocated_ipc, the cost model's
    # costs.refit_gather_s): megatron_bridge = NeMo RL v0.4 on (the TP shard crosses the
    # pipeline stages, then the TP all-gather); gather_params = v0.3 (the TP all-gather first,
    # then the whole tensor crosses the stages)
    refit_export: str = "megatron_bridge"
    # the weight-sync groups' creation before the first sync, as a rendezvous per PP stage
    # (simulators/refit/groups.py); None = not modelled (the sync's group is created per sync)
    weight_sync_groups: Optional["WeightSyncGroupsSpec"] = None
    # a disaggregated pipeline's order (None for every other type)
    disaggregated: Optional[DisaggregatedSpec] = None


@dataclass(frozen=True)
class WeightSyncGroupsSpec:
    """How a pipeline's trainer creates its weight-sync groups with the rollout engines
    before the first sync (``simulators/refit/groups.py``, docs/exploration.md#field-reports):
    one group per PP stage, each a rendezvous of that stage's source rank and every engine,
    then one broadcast per stage. The switches are the buggy and the fixed behaviour of
    the field reports: ``join_order`` concurrent (slime before PR #2331) or phased (after),
    ``receiver_slot`` single (vime before PR #329) or per_group, ``broadcast_timeout_s`` 0
    (no timeout: TRL before PR #6913, NeMo RL before PR #4019) or a limit;
    ``engine_exits`` kills engine 0 just before the broadcast (the receiver died)."""

    pp_stages: int = 2
    engines: int = 2
    join_order: str = "concurrent"  # concurrent | phased
    join_timeout_s: float = 0.0  # 0: a join waits forever
    receiver_slot: str = "single"  # single | per_group
    broadcast_timeout_s: float = 0.0  # 0: a broadcast waits forever
    engine_exits: bool = False
    rpc_latency_s: float = 0.001  # one join RPC, trainer to engine
    broadcast_s: float = 0.5  # one stage's broadcast once every receiver posted it


@dataclass(frozen=True)
class Scenario:
    name: str
    cluster: ClusterSpec
    pipelines: Tuple[PipelineSpec, ...]
    costs: CostSpec = field(default_factory=CostSpec)
    seed: int = 0
    horizon_s: float = 3600.0  # simulated seconds; the run stops here if pipelines are not done
    scheduler: Dict[str, object] = field(default_factory=dict)  # SchedulerOptions fields
    faults: Tuple[FaultSpec, ...] = ()
    description: str = ""
    refit_calibration: str = ""  # a calibration file (rlharness calibrate refit) whose costs fill unset costs
    step_calibration: str = ""  # a calibration file (rlharness calibrate step): efficiency factors for unset costs
    expect: Tuple[Any, ...] = ()  # list of mappings: findings known to occur, each with its reason (table below)


PIPELINE_TYPES = ("nemo_async", "roll_sync", "single_controller", "disaggregated")


def default_scenario() -> Scenario:
    """The default scenario: two nemo_async pipelines on 2 GPUs (ppl1 train [0] infer [0,1];
    ppl2 train [1] infer [0,1])."""
    return Scenario(
        name="default",
        cluster=ClusterSpec(nodes=1, gpus_per_node=2),
        pipelines=(
            PipelineSpec("ppl1", "nemo_async", (0,), (0, 1)),
            PipelineSpec("ppl2", "nemo_async", (1,), (0, 1)),
        ),
        description="two NeMo async pipelines time-sharing 2 GPUs with partial overlap",
    )


def pipeline_names(s: Scenario) -> List[str]:
    return [p.name for p in s.pipelines]


def find_pipeline(s: Scenario, name: str) -> Optional[PipelineSpec]:
    for p in s.pipelines:
        if p.name == name:
            return p
    return None
