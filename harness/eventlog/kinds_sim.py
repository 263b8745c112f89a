"""Record kinds the simulator adds (docs/trace-format.md, "Simulator records").

Every kind here is a *runtime* kind: replay passes over it; the invariants and the
simulator's outputs (summary table, Perfetto trace, PNG timeline) read it.
"""

from typing import Optional


def _k(doc: str, required: dict, optional: Optional[dict] = None) -> dict:
    return {"required": required, "optional": dict(optional or {}), "doc": doc}


SIM_KINDS: dict = {
    "rank_state": _k(
        "An inference DP rank entered a lifecycle state (asleep|waking|awake_unrouted|synced|routable|draining|stopped).",
        {"pipeline_id": "str", "dp_rank": "int", "state": "str", "gpus": "int_list"},
        {"version": "int?", "asleep_tags": "list"},
    ),
    "engine_tag": _k(
        "A memory tag of a rank's engine woke on its own (a staged wake: the KV cache after the refit; harness/control/engine.py; "
        "a gate's engine writes one per tag it wakes, and tag prefix_cache state invalidated for a prefix-cache reset); tag memo_cache: the memo kept in the weights' "
        "region was used (state used: the post-load processing read it) or dropped (invalidated). "
        "A rank_state record's asleep_tags lists the tags still asleep in a state past waking.",
        {"pipeline_id": "str", "dp_rank": "int", "tag": "str", "state": "str"},
    ),
    "offload_wait": _k(
        "RLix's MILES wait after the training grant ended (rlops/rlix PR #11): outcome ok (the largest used "
        "memory of the GPUs reached the threshold) or timeout (RLix warns 'wake_up may OOM' and trains anyway).",
        {
            "pipeline_id": "str",
            "step": "int",
            "gpus": "int_list",
            "outcome": "str",
            "state_wait_s": "number",
            "memory_wait_s": "number",
            "max_used": "int",
            "threshold": "int",
        },
    ),
    "request_pause": _k(
        "A keep pause froze a request in its rank's engine (it goes on after the rank resumes).",
        {"pipeline_id": "str", "request": "int", "dp_rank": "int", "mode": "str"},
        {"tokens_left": "int"},
    ),
    "request_resume": _k(
        "A request a keep pause froze goes on, on the rank that kept it.",
        {"pipeline_id": "str", "request": "int", "dp_rank": "int"},
    ),
    "request_dispatch": _k(
        "A generation request (one trajectory) was routed to a rank (RLix round robin; it may wait in the rank's engine queue).",
        {"pipeline_id": "str", "request": "int", "dp_rank": "int"},
        {"version": "int?", "attempt": "int"},
    ),
    "request_done": _k(
        "A generation request finished on a rank.",
        {"pipeline_id": "str", "request": "int", "dp_rank": "int", "tokens": "int"},
        {"version": "int?"},
    ),
    "request_abort": _k(
        "A request was aborted by a shrink and goes back to the router (turn-level re-dispatch).",
        {"pipeline_id": "str", "request": "int", "dp_rank": "int"},
    ),
    "request_failed": _k(
        "A request aborted on its last allowed attempt (NeMo: min(3, dp_size)) failed with ShardPreemptedError; its rollout drops it.",
        {"pipeline_id": "str", "request": "int", "attempts": "int", "error": "str"},
    ),
    "batch_consumed": _k(
        "The trainer took a batch for a step; staleness maps age in steps to trajectory count; "
        "dropped: completed trajectories evicted as older than the bound (a disaggregated fully_async pipeline).",
        {"pipeline_id": "str", "step": "int", "trajectories": "int", "staleness": "object"},
        {"dropped": "int"},
    ),
    "trajectory": _k(
        "A disaggregated pipeline's trajectory finished on a generation rank, with the weight versions it started "
        "and ended with (a partial rollout or an in-flight weight update spans more than one).",
        {"pipeline_id": "str", "trajectory": "int", "dp_rank": "int", "first_version": "int", "version": "int"},
    ),
    "trajectory_dispatch": _k(
        "A disaggregated pipeline dispatched a trajectory to its generation ranks, with the trainer's weight "
        "version then (the fully asynchronous rollouter's admission window counts from it).",
        {"pipeline_id": "str", "trajectory": "int", "trainer_version": "int"},
    ),
    "trajectory_evicted": _k(
        "A disaggregated fully_async trainer evicted completed trajectories older than its bound (they leave "
        "the rollouter's admission window).",
        {"pipeline_id": "str", "trajectories": "int_list", "trainer_version": "int"},
    ),
    "collectives": _k(
        "An activity of a pipeline (train, old_log_probs, weight_sync) started or stopped issuing collectives on a "
        "communicator (phase start|end), or waits for a communicator others issue on (phase wait: an order, such as "
        "a lock per communicator); two activities open on one communicator at once have no order between them, and "
        "waits for communicators in a cycle deadlock (collective_order, the wait-for graph).",
        {"pipeline_id": "str", "communicator": "str", "activity": "str", "phase": "str"},
    ),
    "vram": _k(
        "Resident bytes on a GPU changed (owner = pipeline/train|dpN|sync|ctx, mem = weights|kv_cache|params|grads|optimizer|nccl|staging|cuda_context); phase = what loaded them (init|old_log_probs|train|wake|expand_sync|active_sync; docs/residency.md).",
        {"gpu": "int", "owner": "str", "mem": "str", "delta": "int", "used": "int"},
        {"phase": "str"},
    ),
    "oom": _k(
        "A GPU allocation would exceed capacity: the simulated process dies (fault).",
        {"gpu": "int", "owner": "str", "mem": "str", "requested": "int", "used": "int", "capacity": "int"},
    ),
    "timeout": _k(
        "An RLix timeout expired (what = await_release|resize_sync_lock|selective_sync|shrink_drain|weight_sync_join|weight_sync_broadcast): fail-fast shutdown.",
        {"pipeline_id": "str", "what": "str", "limit_s": "number", "since": "number"},
    ),
    "fault_fired": _k("A scenario fault hook fired.", {"name": "str", "pipeline_id": "str"}, {"step": "int?"}),
    "host_ram": _k(
        "Host RAM held on a node changed (owner = pipeline/cache for the CPU bucket cache, pipeline/dpN for weights a level-1 sleep keeps).",
        {"node": "int", "owner": "str", "delta": "int", "used": "int"},
    ),
    "host_oom": _k(
        "A host-RAM charge would exceed the node's RAM: the simulated process is killed and the run fails.",
        {"node": "int", "owner": "str", "requested": "int", "used": "int", "capacity": "int"},
    ),
    "sim_end": _k(
        "The run ended (reason done|horizon|failed).",
        {"reason": "str", "sim_time": "number", "events": "int"},
        {"detail": "str"},
    ),
}
