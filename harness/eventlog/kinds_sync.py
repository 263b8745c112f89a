"""Record kinds of a weight sync, its groups and the cache lock: one vocabulary for every runtime.

The simulator and the gates write these through the same control logic
(``harness.control.selective_sync`` yields them as ``Emit`` effects), so every check
reads one set of kinds. Who wrote a record is optional context: ``pipeline_id`` (the
simulator), ``rank`` (a gate's torch.distributed rank). ``dp_ranks`` are the target
inference DP ranks; ``members`` of a group are the runtime's process ids (GPUs in the
simulator, one process per GPU; global ranks in a gate).

Kinds an earlier version wrote (:data:`RETIRED_KINDS`) are refused by the reader with
the kind named and its replacement.
"""

from typing import Optional

_W = {"pipeline_id": "str", "rank": "int"}


def _kind(doc: str, required: dict, optional: Optional[dict] = None) -> dict:
    return {"required": required, "optional": {**_W, **(optional or {})}, "doc": doc}


SYNC_KINDS: dict = {
    "cache_lock": _kind(
        "The cache owner's _cache_lock was acquired or released (holder = build|promote|sync); "
        "every runtime writes it the same way (harness/control/cache_lock.py).",
        {"action": "str", "holder": "str"},
        {"version": "int?"},
    ),
    "sync_start": _kind(
        "A selective sync of a cache version starts (under the cache lock): its target DP ranks "
        "and which of them take the same-GPU IPC path and the broadcast path.",
        {"version": "int", "dp_ranks": "int_list", "ipc_dp_ranks": "int_list", "broadcast_dp_ranks": "int_list"},
    ),
    "sync_bucket": _kind(
        "One bucket of a sync reached its targets on one path (ipc|broadcast), after the bucket's barrier.",
        {"version": "int", "bucket": "int", "path": "str", "dp_ranks": "int_list", "bytes": "int"},
    ),
    "sync_end": _kind(
        "A selective sync ended (ok false: an error or the timeout; the group was torn down first).",
        {"version": "int", "ok": "bool"},
        {"error": "str"},
    ),
    "group_create": _kind(
        "A process group was created (purpose sync: a sync's dynamic group; training: the "
        "trainer's groups). members: GPUs in the simulator, global ranks in a gate.",
        {"name": "str", "members": "int_list"},
        {"desc": "str", "purpose": "str"},
    ),
    "group_destroy": _kind(
        "A process group was destroyed.",
        {"name": "str"},
        {"desc": "str", "members": "int_list", "mode": "str", "purpose": "str"},
    ),
    # the weight-sync groups' rendezvous and broadcasts, member by member (the wait-for
    # graph's records: harness/logs/invariants/waitfor.py). A member is a process name: a trainer
    # PP stage's source ("src0") or a rollout engine ("eng1").
    "rendezvous_join": _kind(
        "A member arrived at a group's rendezvous (a blocking join): it waits until every one of members has joined.",
        {"name": "str", "member": "str", "members": "list"},
        {"stage": "int"},
    ),
    "rendezvous_done": _kind(
        "Every member of a group joined: the group exists and its joiners return.", {"name": "str", "members": "list"}
    ),
    "rendezvous_abort": _kind(
        "A member's join gave up (its timeout): it waits no more, the group does not exist.",
        {"name": "str", "member": "str", "error": "str"},
    ),
    "comm_slot": _kind(
        "A receiver's active communicator is now group name (previous: the group it replaced; "
        "an engine with one receiver slot keeps only the last).",
        {"member": "str", "name": "str"},
        {"previous": "str?"},
    ),
    "broadcast_start": _kind(
        "A source starts a broadcast on a group: it waits until every dst has posted the "
        "receive and the transfer ended (timeout_s null: no timeout).",
        {"name": "str", "src": "str", "dsts": "list"},
        {"timeout_s": "number?", "stage": "int"},
    ),
    "broadcast_recv": _kind(
        "A receiver posted its receive on group name, from src (it waits for src's broadcast).",
        {"name": "str", "member": "str", "src": "str"},
        {"stage": "int"},
    ),
    "broadcast_end": _kind(
        "A broadcast ended (ok false: its timeout; the source waits no more).",
        {"name": "str", "src": "str", "ok": "bool"},
        {"error": "str"},
    ),
    "member_exit": _kind(
        "A member process exited (died): it waits for nothing and wakes no one from now on.",
        {"member": "str", "reason": "str"},
    ),
}

#: Kinds of earlier versions -> what replaced them (the reader names both).
RETIRED_KINDS: dict = {
    "refit_bucket": "sync_bucket (path ipc|broadcast instead of transport)",
    "bucket_send": "sync_bucket",
    "bucket_recv": "sync_bucket (written once per bucket and path by the sender)",
    "nccl_group": "group_create / group_destroy (members instead of gpus)",
}
