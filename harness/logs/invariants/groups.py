"""Dynamic sync groups (``sync_groups``): proper subsets, destroyed after every sync, never
leaked — on the ``group_create`` / ``group_destroy`` records every runtime writes.

A *dynamic sync group* is one whose ``group_create`` says purpose ``sync`` (never read
from a name). Groups are keyed by who wrote the record (``pipeline_id``, or a gate's
``rank``) and the name. A group is a proper subset of the world the log declares: the
``gate_start`` world size, else the processes of the pipeline's ``register`` (and its
members must be that pipeline's GPUs). A sync that ended well (``sync_end`` ok) with its
writer's group still alive stranded it. A log that ended in a failure (``sim_end``
failed, ``gate_abort``, a failed ``gate_end``) is not held to "never leaked": RLix fails
fast mid-sync and leaves the group to the dying processes.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from harness.logs.invariants.allocations import Registered
from harness.logs.invariants.base import Records, Violation, invariant

SYNC_PURPOSE = "sync"
NAME = "sync_groups"


def _members_problem(members: List[int], world: Optional[int], what: str) -> Optional[str]:
    if len(set(members)) != len(members):
        return f"{what} names a member twice: {members} (NCCL cannot group two ranks of one GPU)"
    if len(members) < 2:
        return f"{what} has {len(members)} member(s): a broadcast group needs the owner and a target"
    if world is not None and len(members) >= world:
        return f"{what} has {len(members)} members, not a proper subset of the {world}-process world (a group equal to the world hangs on PCIe)"
    return None


def _ends_in_failure(r: dict, k: str) -> bool:
    """Whether ``r`` (of kind ``k``) says the run failed: its groups may then stay alive."""
    return (
        (k == "sim_end" and r["reason"] == "failed")
        or k == "gate_abort"
        or (k == "gate_end" and r["status"] == "failed")
    )


def _writer(r: dict) -> str:
    pid = r.get("pipeline_id")
    return pid if pid is not None else f"rank {r.get('rank')}"


def _create_problem(r: dict, world: Optional[int], registry: Dict[str, Registered]) -> Optional[str]:
    who, name, members = _writer(r), r["name"], r["members"]
    reg = registry.get(r["pipeline_id"]) if "pipeline_id" in r else None
    size = world if world is not None else (reg.processes() if reg is not None else None)
    problem = _members_problem(members, size, f"{who}: sync group {name} {members}")
    if problem is None and world is not None and not all(0 <= m < world for m in members):
        problem = f"{who}: sync group {name} {members} names ranks outside the world of {world}"
    if problem is None and reg is not None:
        outside = sorted(set(members) - {g for m in reg.mappings.values() for g in m})
        if outside:
            problem = f"{who}: sync group {name} includes GPU(s) {outside} the pipeline does not own"
    return problem


@invariant(
    NAME,
    reads=("group_create", "group_destroy", "sync_end"),
    sees=("sim_end", "gate_abort", "gate_end", "gate_start", "register"),
)
def sync_groups(records: Records) -> List[Violation]:
    out: List[Violation] = []
    failed = False  # (found in the same pass: the check runs online, harness/logs/invariants/online.py)
    world: Optional[int] = None
    registry: Dict[str, Registered] = {}
    live: Dict[Tuple[str, str], int] = {}  # (writer, group name) -> seq of its create
    sync_names: Set[Tuple[str, str]] = set()
    stranded: Set[Tuple[str, str]] = set()
    for r in records:
        k = r["kind"]
        failed = failed or _ends_in_failure(r, k)
        if k == "gate_start":
            world = r["world_size"]
        elif k == "register":
            registry[r["pipeline_id"]] = Registered(
                {n: sorted(m) for n, m in r["cluster_device_mappings"].items()}, dict(r["cluster_tp_configs"])
            )
        elif k == "group_create" and r.get("purpose") == SYNC_PURPOSE:
            key = (_writer(r), r["name"])
            sync_names.add(key)
            if key in live:
                out.append(Violation(NAME, r["seq"], f"{key[0]}: group {key[1]} created again while alive"))
            live[key] = r["seq"]
            problem = _create_problem(r, world, registry)
            if problem:
                out.append(Violation(NAME, r["seq"], problem))
        elif k == "group_destroy" and (r.get("purpose") == SYNC_PURPOSE or (_writer(r), r["name"]) in sync_names):
            if live.pop((_writer(r), r["name"]), None) is None:
                out.append(Violation(NAME, r["seq"], f"{_writer(r)}: group {r['name']} destroyed while not alive"))
        elif k == "sync_end" and r["ok"]:
            who = _writer(r)
            for (w, name), seq in sorted(live.items()):
                if w == who and (w, name) not in stranded:
                    stranded.add((w, name))  # reported once, at the end of the sync that left it
                    out.append(
                        Violation(
                            NAME,
                            r["seq"],
                            f"{who}: sync ended with its group {name} (created at seq {seq}) still alive",
                        )
                    )
    if not failed and records:
        end = records[-1]["seq"]
        for key, seq in sorted(live.items()):
            if key not in stranded:
                out.append(
                    Violation(
                        NAME, end, f"{key[0]}: sync group {key[1]} (created at seq {seq}) leaked: never destroyed"
                    )
                )
    return out
