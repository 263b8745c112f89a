"""``version_span``: the weight versions a trajectory's tokens were generated with, judged
against its pipeline's partial-rollout setting and staleness window.

Two reports motivate it. THUDM/slime #2092: slime's fully asynchronous rollout requeues
the samples a weight sync interrupted with their tokens although ``partial_rollout`` is
off, so one sample's tokens come from versions 2, 4 and 6. inclusionAI/AReaL #1388: after
a recovery the rollout controller's staleness capacity, ``(max_staleness + version + 1) *
batch`` less the trajectories already started, counts from a restarted tally, so it
admits more than the window allows and trajectories exceed their staleness bound.

What the check reads is what happened, not the pipeline's own tally: each ``trajectory``
record's first and last weight version (at its first token and at completion), each
``trajectory_dispatch`` with the trainer's version at dispatch, and each
``trajectory_evicted`` (trajectories the trainer dropped as too old, which leave the
window). The settings come from the header (``meta.version_span``, pipeline ->
``partial_rollout``, and for a fully asynchronous rollouter ``max_age`` and ``batch``).
A log without them (gates, imports, older logs) is skipped.

Only disaggregated pipelines write these records: the RLix-scheduled ones retry an aborted
request's turn from its start, so its tokens come from the version of its last dispatch by
construction, and ``version_at_dispatch`` and ``trajectory_age`` judge what can go wrong there
(docs/modelled-systems.md#disaggregated-pipelines).
"""

from __future__ import annotations

from typing import Any, Dict, List

from harness.logs.invariants.base import Records, Violation, invariant

NAME = "version_span"


@invariant(NAME, reads=("trajectory", "trajectory_dispatch", "trajectory_evicted"), sees=("header",))
def version_span(records: Records) -> List[Violation]:
    """Without partial rollout a trajectory is generated with one weight version; a fully
    asynchronous rollouter never has more trajectories in its window than
    ``(trainer_version + 1 + max_age) * batch`` when it dispatches one."""
    head = records[0] if records and records[0]["kind"] == "header" else {}
    settings: Dict[str, Dict[str, Any]] = (head.get("meta") or {}).get("version_span") or {}
    out: List[Violation] = []
    live: Dict[str, int] = {}  # pipeline -> dispatched less evicted
    for r in records:
        kind = r["kind"]
        s = settings.get(r.get("pipeline_id"))
        if s is None:
            continue
        pid = r["pipeline_id"]
        if kind == "trajectory" and not s.get("partial_rollout") and r["first_version"] != r["version"]:
            out.append(
                Violation(
                    NAME,
                    r["seq"],
                    f"{pid} trajectory {r['trajectory']} was generated with weight "
                    f"versions {r['first_version']}..{r['version']} although partial rollout is off",
                )
            )
        elif kind == "trajectory_evicted":
            live[pid] = live.get(pid, 0) - len(r["trajectories"])
        elif kind == "trajectory_dispatch" and "max_age" in s:
            live[pid] = live.get(pid, 0) + 1
            window = (r["trainer_version"] + 1 + s["max_age"]) * s["batch"]
            if live[pid] > window:
                out.append(
                    Violation(
                        NAME,
                        r["seq"],
                        f"{pid} dispatched trajectory {r['trajectory']} with "
                        f"{live[pid]} in its window at trainer version {r['trainer_version']}; the "
                        f"staleness bound {s['max_age']} allows {window}",
                    )
                )
    return out
