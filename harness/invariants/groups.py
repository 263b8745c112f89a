"""Dynamic sync groups (invariant 13): proper subsets, destroyed after every sync, never
leaked — on the simulator's ``nccl_group`` records and the gates' ``group_create`` /
``group_destroy`` records.

Which groups are *dynamic sync groups*: those the runtime created for a sync — purpose
``sync`` on a simulator ``nccl_group`` record, ``sync`` or ``selective_sync`` on a gate
``group_create`` (never read from a name); in an older simulator log without
``purpose``, a group created while a ``SyncFromCache`` effect of its pipeline is open. A log that ended in a
failure (``sim_end`` failed, ``gate_abort``, a failed ``gate_end``) is not held to "never
leaked": RLix fails fast mid-sync and leaves the group to the dying processes.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from harness.invariants.allocations import Registered
from harness.invariants.base import Records, Violation, invariant

SYNC_PURPOSES = ("sync", "selective_sync")
NAME = "sync_groups"


def _members_problem(members: List[int], world: Optional[int], what: str) -> Optional[str]:
    if len(set(members)) != len(members):
        return f"{what} names a member twice: {members} (NCCL cannot group two ranks of one GPU)"
    if len(members) < 2:
        return f"{what} has {len(members)} member(s): a broadcast group needs the owner and a target"
    if world is not None and len(members) >= world:
        return f"{what} has {len(members)} members, not a proper subset of the {world}-process world (a group equal to the world hangs on PCIe)"
    return None


def _ended_in_failure(records: Records) -> bool:
    for r in records:
        k = r["kind"]
        if (k == "sim_end" and r["reason"] == "failed") or k == "gate_abort" or (k == "gate_end" and r["status"] == "failed"):
            return True
    return False


@invariant(NAME, reads=("nccl_group", "group_create", "group_destroy"),
           sees=("sim_end", "gate_abort", "gate_end", "gate_start", "register", "effect_start", "effect_end", "sync_end"))
def sync_groups(records: Records) -> List[Violation]:
    out: List[Violation] = []
    failed = _ended_in_failure(records)
    out += _simulator_groups(records, failed)
    out += _gate_groups(records, failed)
    return out


def _simulator_groups(records: Records, failed: bool) -> List[Violation]:
    out: List[Violation] = []
    registry: Dict[str, Registered] = {}
    open_syncs: Dict[str, int] = {}  # pipeline -> open SyncFromCache effects
    live: Dict[Tuple[str, str], int] = {}  # (pipeline, group name) -> seq of its create (sync groups)
    stranded: Set[Tuple[str, str]] = set()
    for r in records:
        k = r["kind"]
        if k == "register":
            registry[r["pipeline_id"]] = Registered(
                {n: sorted(m) for n, m in r["cluster_device_mappings"].items()}, dict(r["cluster_tp_configs"]))
        elif k in ("effect_start", "effect_end") and r["effect"] == "SyncFromCache":
            pid = r["pipeline_id"]
            if k == "effect_start":
                open_syncs[pid] = open_syncs.get(pid, 0) + 1
                continue
            open_syncs[pid] = max(0, open_syncs.get(pid, 0) - 1)
            if not open_syncs[pid] and not r.get("error"):
                for (p, name), seq in sorted(live.items()):
                    if p == pid and (p, name) not in stranded:
                        stranded.add((p, name))  # reported once, at the end of the sync that left it
                        out.append(Violation(NAME, r["seq"], f"{pid}: sync ended with its group {name} (created at seq {seq}) still alive"))
        elif k == "nccl_group":
            pid, name = r["pipeline_id"], r["name"]
            key = (pid, name)
            if r["action"] == "create":
                purpose = r.get("purpose")
                if purpose != "sync" and (purpose is not None or not open_syncs.get(pid)):
                    continue  # a training group, not a dynamic sync group
                if key in live:
                    out.append(Violation(NAME, r["seq"], f"{pid}: group {name} created again while alive"))
                live[key] = r["seq"]
                reg = registry.get(pid)
                world = reg.processes() if reg else None
                gpus = r["gpus"]
                problem = _members_problem(gpus, world, f"{pid}: sync group {name} on GPUs {gpus}")
                if problem is None and reg is not None:
                    outside = sorted(set(gpus) - {g for m in reg.mappings.values() for g in m})
                    if outside:
                        problem = f"{pid}: sync group {name} includes GPU(s) {outside} the pipeline does not own"
                if problem:
                    out.append(Violation(NAME, r["seq"], problem))
            elif key in live:
                del live[key]
            elif r.get("purpose") == "sync":
                out.append(Violation(NAME, r["seq"], f"{pid}: group {name} destroyed while not alive"))
    if not failed and records:
        end = records[-1]["seq"]
        for (pid, name), seq in sorted(live.items()):
            if (pid, name) in stranded:
                continue
            out.append(Violation(NAME, end, f"{pid}: sync group {name} (created at seq {seq}) leaked: never destroyed"))
    return out


def _gate_groups(records: Records, failed: bool) -> List[Violation]:
    out: List[Violation] = []
    world: Optional[int] = None
    live: Dict[Tuple[int, str], int] = {}  # (rank, name) -> seq of create
    sync_names: Set[str] = set()
    for r in records:
        k = r["kind"]
        if k == "gate_start":
            world = r["world_size"]
        elif k == "group_create" and r.get("purpose") in SYNC_PURPOSES:
            key = (r["rank"], r["name"])
            sync_names.add(r["name"])
            if key in live:
                out.append(Violation(NAME, r["seq"], f"rank {r['rank']}: group {r['name']} created again while alive"))
            live[key] = r["seq"]
            problem = _members_problem(r["members"], world, f"rank {r['rank']}: sync group {r['name']} {r['members']}")
            if problem is None and world is not None and not all(0 <= m < world for m in r["members"]):
                problem = f"rank {r['rank']}: sync group {r['name']} {r['members']} names ranks outside the world of {world}"
            if problem:
                out.append(Violation(NAME, r["seq"], problem))
        elif k == "group_destroy" and r["name"] in sync_names:
            if live.pop((r["rank"], r["name"]), None) is None:
                out.append(Violation(NAME, r["seq"], f"rank {r['rank']}: group {r['name']} destroyed while not alive"))
        elif k == "sync_end" and r["ok"]:
            for (rank, name), seq in sorted(live.items()):
                if rank == r["rank"]:
                    out.append(Violation(NAME, r["seq"], f"rank {rank}: sync ended with its group {name} (created at seq {seq}) still alive"))
    if not failed and records:
        end = records[-1]["seq"]
        for (rank, name), seq in sorted(live.items()):
            out.append(Violation(NAME, end, f"rank {rank}: sync group {name} (created at seq {seq}) leaked: never destroyed"))
    return out
