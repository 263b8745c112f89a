"""Record kinds written by the GPU gates (gpu_gates/). Replay passes over them.

Every gate record carries ``rank`` (the torch.distributed rank that emitted it); rank 0
merges all ranks' records ordered by ``(t, rank, per-rank order)``. ``t`` is seconds since
rank 0 started the gate. The ``versions`` check reads ``weights_publish``. A sync's and a group's records are
shared with the simulator (``kinds_sync.py``).
"""

from typing import Optional

_R = {"rank": "int"}


def _kind(doc: str, required: dict, optional: Optional[dict] = None) -> dict:
    return {"required": {**_R, **required}, "optional": dict(optional or {}), "doc": doc}


GATE_KINDS: dict = {
    "gate_start": _kind(
        "A gate rank started (after process-group init).",
        {"gate": "str", "backend": "str", "world_size": "int", "cycles": "int", "device": "str"},
    ),
    "gate_end": _kind("A gate rank finished; status passed|failed|skipped.", {"status": "str"}),
    "gate_abort": _kind("A gate rank hit its watchdog deadline or was terminated.", {"reason": "str"}),
    "hook_fired": _kind("A test-only fault hook fired on this rank (tests break gates on purpose).", {"hook": "str"}),
    "memory_sample": _kind(
        "Memory at a labelled point: device bytes in use on GPU, RSS on CPU (informational).",
        {"label": "str", "informational": "bool"},
        {"used": "int?", "delta_used": "int?"},
    ),
    "cycle_begin": _kind(
        "A gate cycle begins.", {"cycle": "int"}, {"mode": "str", "version": "int", "targets": "int_list"}
    ),
    "cycle_end": _kind(
        "A gate cycle ended.", {"cycle": "int"}, {"mode": "str", "survived": "int", "live_groups": "int"}
    ),
    "allreduce_check": _kind(
        "An all-reduce correctness check on a model-parallel group.",
        {"group": "str", "members": "int_list", "ok": "bool"},
    ),
    "stale_probe": _kind(
        "After teardown: is the old group handle still registered/usable?",
        {"group": "str", "registered": "bool"},
        {"collective_raised": "bool?"},
    ),
    "cache_build": _kind(
        "The cache owner built a CPU bucket cache version.", {"version": "int", "buckets": "int", "bytes": "int"}
    ),
    "cache_promote": _kind("The cache owner promoted a version to active.", {"version": "int"}),
    "digest_check": _kind(
        "Per-tensor SHA-256 comparison of a receiver's weights with the owner's.",
        {"version": "int", "ok": "bool", "mismatches": "int"},
        {"target": "bool"},
    ),
    "weights_publish": _kind(
        "The owner published a weight version after every target acknowledged.",
        {"version": "int", "targets": "int_list"},
    ),
    "trend_sample": _kind(
        "One cycle's measurement of a series the cycle_trends check fits a line through "
        "(series = family/key; family residue_bytes|ipc_bytes|live_groups|refit_s).",
        {"series": "str", "cycle": "int", "value": "number"},
    ),
    "engine_required": _kind(
        "The tensors an inference engine needs loaded before it may serve (parameters and "
        "non-parameter state such as FP8 KV-cache scales); step = the refit it is about to take.",
        {"step": "int", "names": "list"},
    ),
}
