"""Record kinds written by the GPU gates (gpu_gates/). Replay passes over them.

Every gate record carries ``rank`` (the torch.distributed rank that emitted it); rank 0
merges all ranks' records ordered by ``(t, rank, per-rank order)``. ``t`` is seconds since
rank 0 started the gate. Invariant 13 (dynamic sync groups are proper subsets and never
leaked) reads ``group_create``/``group_destroy``; invariant 9 reads ``weights_publish``.
"""

_R = {"rank": "int"}


def _kind(doc: str, required: dict, optional: dict = None) -> dict:
    return {"required": {**_R, **required}, "optional": dict(optional or {}), "doc": doc}


GATE_KINDS: dict = {
    "gate_start": _kind("A gate rank started (after process-group init).",
                        {"gate": "str", "backend": "str", "world_size": "int", "cycles": "int", "device": "str"}),
    "gate_end": _kind("A gate rank finished; status passed|failed|skipped.", {"status": "str"}),
    "gate_abort": _kind("A gate rank hit its watchdog deadline or was terminated.", {"reason": "str"}),
    "hook_fired": _kind("A test-only fault hook fired on this rank (tests break gates on purpose).", {"hook": "str"}),
    "memory_sample": _kind("Memory at a labelled point: device bytes in use on GPU, RSS on CPU (informational).",
                           {"label": "str", "informational": "bool"}, {"used": "int?", "delta_used": "int?"}),
    "cycle_begin": _kind("A gate cycle begins.", {"cycle": "int"},
                         {"mode": "str", "version": "int", "targets": "int_list"}),
    "cycle_end": _kind("A gate cycle ended.", {"cycle": "int"},
                       {"mode": "str", "survived": "int", "live_groups": "int"}),
    "group_create": _kind("This rank registered a process group (members are global ranks).",
                          {"name": "str", "members": "int_list"}, {"desc": "str", "purpose": "str"}),
    "group_destroy": _kind("This rank destroyed a process group.",
                           {"name": "str"}, {"desc": "str", "members": "int_list", "mode": "str"}),
    "allreduce_check": _kind("An all-reduce correctness check on a model-parallel group.",
                             {"group": "str", "members": "int_list", "ok": "bool"}),
    "stale_probe": _kind("After teardown: is the old group handle still registered/usable?",
                         {"group": "str", "registered": "bool"}, {"collective_raised": "bool?"}),
    "cache_build": _kind("The cache owner built a CPU bucket cache version.",
                         {"version": "int", "buckets": "int", "bytes": "int"}),
    "cache_promote": _kind("The cache owner promoted a version to active.", {"version": "int"}),
    "sync_start": _kind("A selective sync of the active cache version starts.",
                        {"version": "int", "targets": "int_list", "ipc_ranks": "int_list", "broadcast_ranks": "int_list"}),
    "sync_end": _kind("A selective sync ended on this rank.", {"version": "int", "ok": "bool"}),
    "bucket_send": _kind("The owner sent one bucket over the sync group (path broadcast; same-GPU targets get the refit stream).",
                         {"version": "int", "bucket": "int", "bytes": "int", "path": "str", "targets": "int_list"}),
    "bucket_recv": _kind("A receiver got and unpacked one broadcast bucket (path broadcast).",
                         {"version": "int", "bucket": "int", "bytes": "int", "path": "str"}),
    "digest_check": _kind("Per-tensor SHA-256 comparison of a receiver's weights with the owner's.",
                          {"version": "int", "ok": "bool", "mismatches": "int"}, {"target": "bool"}),
    "weights_publish": _kind("The owner published a weight version after every target acknowledged.",
                             {"version": "int", "targets": "int_list"}),
}
