"""What a run found, named so that two seeds that found the same thing share the name.

A signature keeps what a finding *is* and drops what only names where it happened in one
seed: pipeline names become their types (the pipeline's role), GPU ids, ranks, sizes and
times are dropped. It is read from the log, never from what the simulator says about its
own correctness: the first violated invariant (the oracle's check name) or the record
that ended the run (an OOM and the kind of memory, an RLix timeout and what timed out, a
plan-validation failure and its condition), whichever comes first in the log. Faults the
scenario injected and that fired before that point are appended: ``oom:weights +wake_before_offload`` is
the expected result of that fault, while the same OOM without a fault is a bug.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Sequence

from harness.logs.invariants import Violation

CLEAN = "clean"
# a pipeline name stands alone, or heads a cluster id (``p0_actor_train``) or an owner
# (``p0/dp1``): both name the pipeline
_AFTER_NAME = r"(?=$|[^\w-]|_actor_|_critic|_reference|_reward)"
_FAILURE_KINDS = ("oom", "timeout", "validation_failed", "scheduler_failed")


def _roles(text: str, types: Dict[str, str]) -> List[str]:
    """Types of the pipelines a text names (whole-word matches), sorted, unique."""
    found = {t for name, t in types.items() if re.search(rf"(?<![\w-]){re.escape(name)}{_AFTER_NAME}", text)}
    return sorted(found)


def _with_roles(head: str, roles: Sequence[str]) -> str:
    return f"{head}[{','.join(roles)}]" if roles else head


def _normalized(detail: str, types: Dict[str, str]) -> str:
    """A failure message without names and numbers: pipeline names -> types, digits -> N."""
    for name in sorted(types, key=len, reverse=True):
        detail = re.sub(rf"(?<![\w-]){re.escape(name)}{_AFTER_NAME}", types[name], detail)
    detail = re.sub(r"\[[\d, ]*\]", "[..]", detail)
    detail = re.sub(r"\d+(\.\d+)?", "N", detail)
    return re.sub(r"\s+", " ", detail).strip()


def _failure(records: Sequence[dict], types: Dict[str, str]) -> Optional[tuple]:
    """(seq, signature) of the record that ended a failed run, or None."""
    end = records[-1] if records and records[-1]["kind"] == "sim_end" else None
    for r in records:
        kind = r["kind"]
        if kind not in _FAILURE_KINDS:
            continue
        roles = _roles(str(r.get("owner", r.get("pipeline_id", ""))), types)
        if kind == "oom":
            return r["seq"], _with_roles(f"oom:{r['mem']}", roles)
        if kind == "timeout":
            return r["seq"], _with_roles(f"timeout:{r['what']}", roles)
        if kind == "validation_failed":
            return r["seq"], f"plan_validation:condition_{r['condition']}"
        return r["seq"], "scheduler_failed:" + _normalized(str(r.get("reason", "")), types)
    if end is not None and end.get("reason") == "failed":
        return end["seq"], "failed:" + _normalized(str(end.get("detail", "")), types)
    if end is not None and end.get("reason") == "horizon":
        return end["seq"], _horizon(records, types)
    return None


def failure_finding(records: Sequence[dict], types: Dict[str, str]):
    """The record that ended a failed run as a :class:`harness.logs.expect.Finding` (its
    check is the signature's head, its pipelines the names and types it names)."""
    from harness.logs.expect import Finding, from_signature, named_in

    found = _failure(records, types)
    seq, head = found if found is not None else (records[-1]["seq"] if records else -1, "failed:unknown")
    rec = next((r for r in records if r.get("seq") == seq), {})
    text = " ".join(str(rec.get(k, "")) for k in ("owner", "pipeline_id", "cluster_id", "detail", "reason", "what"))
    names = named_in(text, types)
    check = from_signature(head).check  # the head without its [roles]
    fired = tuple(sorted({r["name"] for r in records if r["kind"] == "fault_fired" and r["seq"] <= seq}))
    return Finding(check, f"{head}: {text.strip()}", seq, tuple(names + sorted({types[n] for n in names})), (), fired)


def _horizon(records: Sequence[dict], types: Dict[str, str]) -> str:
    """``horizon:never_trained[...]`` when some pipeline never consumed a batch (a stall
    before its first step), else ``horizon:unfinished[...]`` (the pipelines still running)."""
    # a step's batch taken (colocated pipelines) or a split-API step finished (single controller)
    trained = {
        r["pipeline_id"]
        for r in records
        if r["kind"] == "batch_consumed" or (r["kind"] == "trainer_step" and r.get("action") == "finish")
    }
    gone = {r["pipeline_id"] for r in records if r["kind"] == "unregister"}
    never = sorted({types[p] for p in types if p not in trained and p not in gone})
    if never:
        return _with_roles("horizon:never_trained", never)
    return _with_roles("horizon:unfinished", sorted({types[p] for p in types if p not in gone}))


def signature(records: Sequence[dict], violations: Iterable[Violation], types: Dict[str, str]) -> str:
    """The run's signature: ``clean`` or the first finding in log order (+ fired faults).

    ``types`` maps each pipeline name of the scenario to its type."""
    firsts = sorted(violations, key=lambda v: (v.seq, v.invariant))
    candidates = []
    if firsts:
        v = firsts[0]
        candidates.append((v.seq, _with_roles(v.invariant, _roles(v.message, types))))
    failure = _failure(records, types)
    if failure is not None:
        candidates.append(failure)
    if not candidates:
        return CLEAN
    at, head = min(candidates)
    # only a fault that fired before the finding can have caused it
    fired = sorted({r["name"] for r in records if r["kind"] == "fault_fired" and r["seq"] <= at})
    return head + "".join(f" +{name}" for name in fired)
