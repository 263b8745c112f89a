"""Known upstream behaviour: findings traced to the modelled systems' own code.

Some findings are not something new going wrong in a user's configuration: they are what
RLix, NeMo RL or ROLL do today, read in their code at a pinned commit. A user who writes
their own realistic layout hits them on every run (NeMo's init keeps its Megatron groups
on multi-GPU trainers, so a 70B on 64 GPUs shows one ``handover`` per GPU its inference
wakes on). Red would then mean "you use RLix", not "something is wrong".

Every command applies this list by default, after the scenario's ``expect:`` and any
``--baseline`` (those claim a finding first, with their own reason). A finding one of
these entries matches is reported in one line per behaviour — what, where, how much and
the upstream source — and does not fail the run; an entry that matched nothing is not
reported (it is a property of the modelled system, not an expectation of this run).
``--upstream-as-findings`` leaves the list out, for people changing RLix or NeMo RL
themselves. A memory residue the known behaviour leaves is still checked against the
wake's margin (``harness/logs/outputs/headroom.py``): too little headroom is a finding even
when its cause is known.

Entries match like an expectation (harness.logs.expect), plus a glob on the finding's message
where the check alone is too wide (a ``handover`` left by NeMo's init, not any handover).
Sources are cited as (repository, commit, path, what); docs/expected-findings.md lists them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from harness.logs.expect import Expectation, Finding

RLIX = "rlops/rlix f77d913 (branch nemo)"


@dataclass(frozen=True)
class KnownBehaviour:
    name: str
    check: str
    what: str  # one sentence: what the modelled system does
    source: str  # repository, commit, path (and the upstream issue or debug entry)
    pipeline: str = "*"
    message: str = "*"

    def expectation(self) -> Expectation:
        return Expectation(
            self.check,
            self.what,
            pipeline=None if self.pipeline == "*" else self.pipeline,
            message=None if self.message == "*" else self.message,
            known=self.name,
            source=f"known upstream behaviour {self.name}",
        )


KNOWN_UPSTREAM: Tuple[KnownBehaviour, ...] = (
    KnownBehaviour(
        "nemo_init_keeps_groups",
        "handover",
        "NeMo RL's init offloads the training state but keeps the Megatron process groups alive, so their "
        "communicator buffers stay on the training GPUs where inference ranks later wake",
        f"{RLIX} rlix/pipeline/nemo_rl_pipeline.py initialize_pipeline (pp_group kept alive: RLix debug #24)",
        pipeline="nemo_async",
        message="*_actor_train's nccl * left by phase init",
    ),
    KnownBehaviour(
        "roll_old_log_probs_keep_states",
        "handover",
        "RLix's ROLL pipeline computes old log-probs with is_offload_states=False, then release_then_request: "
        "another cluster can be granted the GPUs while the parameters and process groups are still there",
        f"{RLIX} rlix/pipeline/full_finetune_pipeline.py run() Phase 12/16; alibaba/ROLL 8eb27cc "
        "roll/utils/context_managers.py state_offload_manger",
        pipeline="roll_sync",
        message="*left by phase old_log_probs",
    ),
    KnownBehaviour(
        "premature_planned_release_ack",
        "planned_release_ack",
        "RLix's Phase 6 acks every pending planned release unconditionally, so a release registered in the "
        "cycle's lock gap is acked while ranks it expanded still serve",
        f"{RLIX} rlix/scheduler/scheduler.py _apply_plan_and_signal (Phase 6: planned releases signalled unconditionally); "
        "scheduler option ack_unplanned_releases: false is the fix",
    ),
    KnownBehaviour(
        "stale_after_premature_ack",
        "stale_serving",
        "the premature planned-release ack's consequence on a ROLL pipeline: the ranks it left serving keep the "
        "previous weights after a new version is published",
        f"{RLIX} rlix/scheduler/scheduler.py _apply_plan_and_signal; rlix/pipeline/full_finetune_pipeline.py run()",
        pipeline="roll_sync",
    ),
    KnownBehaviour(
        "unregister_before_kill",
        "in_flight_at_sleep",
        "after a premature planned-release ack a finished pipeline still has ranks serving; RLix's cleanup "
        "unregisters it (its GPUs go idle) before killing its actors, which aborts what they still run",
        f"{RLIX} rlix/pipeline/nemo_rl_pipeline.py run() finally (await_release_actor_infer); "
        "rlix/orchestrator/orchestrator.py kill_pipeline (step 2 unregister, step 3 kill actors)",
        message="* unregistered with * request(s) still running*",
    ),
    KnownBehaviour(
        "ungrantable_preemption",
        "ungrantable_preemption",
        "RLix's Phase 2 keeps the GENERATION shrinks it made for a training request that still cannot be "
        "granted: the GPUs idle and the rank is re-expanded and shrunk again",
        f"{RLIX} rlix/scheduler/scheduler.py scheduling_cycle Phase 2 donor scan; scheduler option "
        "rollback_ungrantable_preemption: true is the fix",
    ),
)


def upstream_expectations(as_findings: bool = False) -> List[Expectation]:
    """What every command appends to the user's expectations (none under ``--upstream-as-findings``)."""
    return [] if as_findings else [k.expectation() for k in KNOWN_UPSTREAM]


BY_NAME: Dict[str, KnownBehaviour] = {k.name: k for k in KNOWN_UPSTREAM}

_GPUS = re.compile(r"\bGPUs? \[?(\d+(?:, \d+)*)\]?")
_BYTES = re.compile(r"\b(\d+) B\b")


def _span(ids: Sequence[int]) -> str:
    """``0-3, 8`` for GPUs 0, 1, 2, 3 and 8."""
    out, ids = [], sorted(set(ids))
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ", ".join(out)


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}".replace(".0 ", " ")
    return f"{int(n)} B"


def behaviour_line(name: str, findings: Sequence[Finding]) -> str:
    """One line: what was hit, where (pipelines and their types, GPUs), its size, its source."""
    k = BY_NAME[name]
    pipes = sorted({p for f in findings for p in f.pipelines})
    gpus = [int(g) for f in findings for m in _GPUS.finditer(f.message) for g in m.group(1).split(", ")]
    sizes = [int(m.group(1)) for f in findings for m in [_BYTES.search(f.message)] if m]
    where = "; ".join(x for x in (", ".join(pipes), f"GPU {_span(gpus)}" if gpus else "") if x)
    size = f"; up to {fmt_bytes(max(sizes))} per GPU" if sizes else ""
    return f"  known upstream  {k.check} x{len(findings)} ({where or 'no pipeline named'}{size}): {k.what} [{k.source}]"


def split_known(violations: Sequence, records: Sequence[dict], types: Dict[str, str]) -> Tuple[list, Dict[str, int]]:
    """(the violations no known upstream behaviour covers, the count of each behaviour hit):
    what a fuzz seed's signature is read from, so a seed that hit only known behaviour is clean
    and one that hit something else is named by that."""
    from harness.logs.expect import classify, from_violations

    violations = list(violations)
    findings = from_violations(violations, records, types)
    verdict = classify(findings, upstream_expectations())
    unexpected = {id(f) for f in verdict.unexpected}
    kept = [v for v, f in zip(violations, findings) if id(f) in unexpected]
    return kept, {name: len(fs) for name, fs in verdict.known_hits().items()}
