"""What a scheduling policy changes in the scheduler-decision checks, read from the header.

The oracle is the same for every policy (docs/policies.md); a policy that legitimately
changes a rule says so in the header's ``scheduler`` mapping (``policy``, and its
``partition`` / ``groups``), and the checks read it here. Absent means ``gap_ratio`` (RLix;
every log written before policies existed). Parts and groups are re-derived from the
logged registrations (every pipeline registered so far, in first-registration order) by
the documented default rules, independently of the model's code:

* ``static_partition``: a pipeline may only use bundles inside its part (explicit, or each
  GPU to the first pipeline that maps it: training mappings first, then inference
  mappings, in registration order);
* ``round_robin``: a pipeline may wait while another member of its co-execution group
  (explicit, or pipelines linked by shared GPUs) holds GENERATION ranks: that is its turn;
* ``acquire_yield``: a pipeline acquires its whole inference mapping or nothing, and a
  non-GENERATION request may not take GPUs another pipeline's GENERATION holds.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Set

GENERATION_SUFFIX = "actor_infer"


def header_policy(records) -> Dict[str, Any]:
    """The header's policy fields: ``policy`` (default gap_ratio), ``partition``, ``groups``."""
    header = records[0] if records and records[0]["kind"] == "header" else {}
    sched = header.get("scheduler") or {}
    return {
        "policy": sched.get("policy", "gap_ratio"),
        "partition": sched.get("partition"),
        "groups": sched.get("groups"),
    }


def parts(registry: Mapping[str, Any], explicit: Optional[Mapping[str, List[int]]]) -> Dict[str, Set[int]]:
    """Each registered pipeline's part under static_partition (see the module docstring)."""
    if explicit:
        return {pid: set(explicit.get(pid, ())) for pid in registry}
    owner: Dict[int, str] = {}
    for want_infer in (False, True):
        for pid, reg in registry.items():
            for name, mapping in reg.mappings.items():
                if (name == GENERATION_SUFFIX) == want_infer:
                    for g in mapping:
                        owner.setdefault(g, pid)
    out: Dict[str, Set[int]] = {pid: set() for pid in registry}
    for g, pid in owner.items():
        out[pid].add(g)
    return out


def group_mates(registry: Mapping[str, Any], explicit: Optional[List[List[str]]], pid: str) -> Set[str]:
    """The other members of ``pid``'s co-execution group under round_robin."""
    if explicit:
        for group in explicit:
            if pid in group:
                return {q for q in group if q != pid and q in registry}
        return set()
    gpus = {q: {g for m in reg.mappings.values() for g in m} for q, reg in registry.items()}
    seen, todo = {pid}, [pid]
    while todo:
        p = todo.pop()
        for q in registry:
            if q not in seen and not gpus[q].isdisjoint(gpus.get(p, ())):
                seen.add(q)
                todo.append(q)
    return seen - {pid}
