"""A single controller's train pump parked on a condition that can no longer become true.

The general ``liveness`` check judges a run cut by its horizon by how long a waiter
waited with no progress; a single controller defeats it, because its stall watchdog and
the rollouts of later steps keep logging progress while the train pump waits forever.
This check needs no time window: it rebuilds, from the log alone, why the open
``SelectGroups`` of the train pump can never be answered.

* **Target out of reach.** The step's target is ``groups_per_step`` (``streaming_setup``)
  minus the prompts dropped for that step (``SkipPrompt`` ends whose ``target_step`` is the
  step: only a stamped prompt is owed to one step), minus the groups already trained in it
  (``ClearSamples`` ends). A select still asking for more than that, after the drop that
  shrank it, waits for groups no one is generating (the in-order drop wedge).
* **Nothing can arrive.** The pump waits in ``SelectGroups`` and nothing of its pipeline is
  under way that could change the buffer: no rollout generating, backing off or committing
  — only the rollout pump parked on its admission gate, a buffer slot or an in-flight slot
  (each of which only the train pump or a rollout can open) and the watchdog's ticks. The
  sampler answered no to this buffer and the buffer can no longer change.

It reads the log as it ends (a horizon, a failure, or a log cut short): a select answered
before the end is no finding.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from harness.logs.invariants.base import Records, Violation, invariant

#: Effects a parked pipeline may still have open: they wait for something else to move.
_PARKED = frozenset(("SelectGroups", "AdmitBatch", "AcquireCapacity", "AcquireInflight", "WatchdogTick"))
#: Effects that say nothing about the buffer (the watchdog's clock).
_IDLE = frozenset(("WatchdogTick", "StallDetected"))


class _Pipe:
    def __init__(self, groups_per_step: int) -> None:
        self.groups_per_step = groups_per_step
        self.open: Dict[str, int] = {}  # effect -> how many are open
        self.select: Optional[dict] = None  # the train pump's open SelectGroups start
        self.dropped: Dict[int, List[float]] = {}  # step -> times of the drops credited to it
        self.trained: Dict[int, int] = {}  # step -> groups cleared in it
        self.last_move = 0.0  # time of the last record that could change the buffer


def _track(p: _Pipe, r: dict) -> None:
    effect, start = r["effect"], r["kind"] == "effect_start"
    p.open[effect] = p.open.get(effect, 0) + (1 if start else -1)
    if effect not in _IDLE and not (start and effect in _PARKED):
        p.last_move = r["t"]
    if effect == "SelectGroups" and r.get("scope") == "step":
        p.select = r if start else None
    if start or r.get("error"):
        return
    if effect == "SkipPrompt" and r["args"].get("target_step") is not None:
        p.dropped.setdefault(r["args"]["target_step"], []).append(r["t"])
    elif effect == "ClearSamples":
        step = r["args"]["step"]
        p.trained[step] = p.trained.get(step, 0) + len(r["args"]["groups"])


def _why(pid: str, p: _Pipe, end_t: float) -> Optional[str]:
    sel = p.select
    step, want = sel["args"].get("step", sel.get("step")), sel["args"]["max_groups"]
    drops = p.dropped.get(step, [])
    left = p.groups_per_step - len(drops) - p.trained.get(step, 0)
    where = f"{pid}: train pump parked in SelectGroups of step {step} since t={sel['t']:.1f}s"
    late = [t for t in drops if sel["t"] <= t < end_t]
    if want > left and late:
        return (
            f"{where} asking for {want} group(s), but the step can get at most {max(left, 0)} "
            f"({p.groups_per_step} per step, {len(drops)} dropped, {p.trained.get(step, 0)} trained): "
            f"a drop at t={late[-1]:.1f}s shrank its target and the select never re-read it"
        )
    busy = [e for e, n in p.open.items() if n > 0 and e not in _PARKED and e not in _IDLE]
    if busy or p.last_move >= end_t:
        return None
    gates = [e for e in ("AdmitBatch", "AcquireCapacity", "AcquireInflight") if p.open.get(e, 0) > 0]
    gate = f"the rollout pump waits in {', '.join(gates)}" if gates else "no rollout pump running"
    return (
        f"{where}: nothing in flight since t={p.last_move:.1f}s and {gate}, which only the train pump "
        f"or a rollout can open: the buffer can no longer change, so the select can never be answered"
    )


@invariant("pump_parked", reads=("streaming_setup", "effect_start", "effect_end"))
def pump_parked(records: Records) -> List[Violation]:
    pipes: Dict[str, _Pipe] = {}
    last: Tuple[int, float] = (0, 0.0)
    for r in records:
        last = (r.get("seq", last[0]), r.get("t", last[1]))
        k = r["kind"]
        if k == "streaming_setup":
            pipes[r["pipeline_id"]] = _Pipe(r["groups_per_step"])
        elif k in ("effect_start", "effect_end") and r.get("pipeline_id") in pipes:
            _track(pipes[r["pipeline_id"]], r)
    out: List[Violation] = []
    for pid, p in sorted(pipes.items()):
        if p.select is not None:
            why = _why(pid, p, last[1])
            if why:
                out.append(Violation("pump_parked", last[0], why))
    return out
